"""scripts/harness/procfs's context-switch readers, on this process: a sleep is a wake
the counters see, and a gone process reads as None, which the bench reports as unread."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import helpers  # noqa: F401  (puts scripts/ on sys.path)
from harness import procfs


def test_a_sleep_counts_as_a_wake_of_this_thread() -> None:
    before = procfs.proc_switches(os.getpid())
    assert before is not None
    for _ in range(5):
        time.sleep(0.002)
    after = procfs.proc_switches(os.getpid())
    assert after is not None and after[0] >= before[0] + 5, (before, after)
    assert after[1] >= before[1]


def test_the_delta_names_each_node_and_is_none_when_one_is_unread() -> None:
    me = SimpleNamespace(node_id="n1", pid=os.getpid())
    gone = SimpleNamespace(node_id="n2", pid=None)
    start = procfs.switch_snapshot([me])
    time.sleep(0.002)
    delta = procfs.switch_delta(start, procfs.switch_snapshot([me]))
    assert delta is not None and set(delta) == {"n1"}
    assert delta["n1"]["woke"] >= 1 and delta["n1"]["preempted"] >= 0
    assert procfs.switch_delta(start, procfs.switch_snapshot([me, gone])) is None
