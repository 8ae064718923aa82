"""Task priorities: higher first, FIFO within one, aging against starvation
(miyamoto.delivery.fairness.ReadyLine), and the field's checks.

The tests drive the ready line with plain objects and made-up arrival times; the real
node's test (tests/nodes/test_delivery_node.py) pauses a queue, fills it, and resumes it
with ``max_concurrent = 1``.
"""

from __future__ import annotations

import pytest

from miyamoto.delivery import fairness
from miyamoto.delivery.fairness import HostSlots, ReadyLine
from miyamoto.wire.verbs import DecodeError
from miyamoto.tasks.task import Task
from miyamoto.tasks.validate import Limits, ValidationError, build_task, form_fields

H, G = "http://h:80", "http://g:80"


def _drain(line: ReadyLine, hosts: HostSlots) -> list[str]:
    out = []
    while (pick := line.take(hosts)) is not None:
        out.append(pick[0])
    return out


# ================================================================ units: the line


@pytest.mark.timeout(10)
def test_higher_priority_first_and_fifo_within_one():
    line, hosts = ReadyLine("q"), HostSlots(100)
    for i, p in enumerate([1, 9, 5, 1, 9, 0, 5]):
        line.append(f"t{i}-p{p}", H, p, at=100.0 + i * 0.01)
    assert _drain(line, hosts) == ["t1-p9", "t4-p9", "t2-p5", "t6-p5", "t0-p1", "t3-p1",
                                   "t5-p0"]
    assert len(line) == 0 and not line.startable()


@pytest.mark.timeout(10)
def test_aging_a_low_priority_goes_ahead_of_what_arrives_long_after_it():
    """Aging as a key: priority p arriving at t goes before priority q arriving at u
    iff t - p * AGING < u - q * AGING. A 0 that waited more than 9 levels' worth of
    aging goes ahead of a fresh 9."""
    step = fairness.AGING_SECONDS
    line, hosts = ReadyLine("q"), HostSlots(100)
    line.append("old-0", H, 0, at=0.0)
    line.append("nine-soon", H, 9, at=9 * step - 1)  # arrived within 90 s: goes first
    line.append("nine-late", H, 9, at=9 * step + 1)  # arrived after 90 s: goes after it
    assert _drain(line, hosts) == ["nine-soon", "old-0", "nine-late"]


@pytest.mark.timeout(10)
def test_aging_ten_seconds_of_waiting_count_as_one_level():
    """As the README and the OpenAPI document say: 10 s of waiting is one level."""
    line, hosts = ReadyLine("q"), HostSlots(100)
    line.append("five", H, 5, at=100.0)
    line.append("six-soon", H, 6, at=109.5)  # within 10 s: the higher level goes first
    line.append("six-late", H, 6, at=110.5)  # after 10 s: the older 5 goes ahead of it
    assert _drain(line, hosts) == ["six-soon", "five", "six-late"]


@pytest.mark.timeout(10)
def test_aging_no_starvation_under_a_steady_stream_of_high_priority(monkeypatch):
    """A fake timeline: every second a priority-9 task arrives and one task starts,
    so the 9s alone would keep the line busy for ever. The priority-0 task that came
    first starts within its bound (9 levels x AGING_SECONDS, plus the backlog ahead
    of it), and without aging (AGING_SECONDS huge) it never does: the test can fail."""

    def started_at(aging: float) -> float | None:
        monkeypatch.setattr(fairness, "AGING_SECONDS", aging)
        line, hosts = ReadyLine("q"), HostSlots(100)
        line.append("zero", H, 0, at=0.0)
        for t in range(600):
            line.append(f"nine-{t}", H, 9, at=float(t))
            pick = line.take(hosts)
            if pick is not None and pick[0] == "zero":
                return float(t)
        return None

    t = started_at(10.0)
    assert t is not None and t <= 9 * 10.0 + 2, t
    assert started_at(1e9) is None  # no aging: starved for all 600 s


@pytest.mark.timeout(10)
def test_tasks_set_aside_for_a_full_target_keep_their_priority_order():
    line, hosts = ReadyLine("q"), HostSlots(1)
    hosts.take(H)  # H is full
    line.append("h-p1", H, 1, at=0.0)
    line.append("g-p1", G, 1, at=0.1)
    line.append("h-p9", H, 9, at=0.2)
    line.append("h-p5", H, 5, at=0.3)
    assert line.take(hosts) == ("g-p1", G)  # H's tasks wait aside, G's goes on
    assert line.take(hosts) is None and line.waiting_on() == [H]
    got = []
    for _ in range(3):  # H frees a slot each time: the highest priority goes first
        for waiter in hosts.release(H):
            line.wake(H)
        pick = line.take(hosts)
        assert pick is not None
        hosts.take(H)
        got.append(pick[0])
    assert got == ["h-p9", "h-p5", "h-p1"]


# ================================================================ units: the field


def _task(**fields) -> Task:
    return build_task({"url": "http://example.com/x", **fields}, path_queue=None,
                      idempotency_key=None, limits=Limits(), now=1000.0)


@pytest.mark.timeout(10)
def test_priority_field_checks_and_round_trip():
    assert _task().priority == 5
    assert _task(priority=0).priority == 0 and _task(priority="9").priority == 9
    assert _task(priority=7.0).priority == 7
    for bad in (10, -1, True, "high", 4.5, [1]):
        with pytest.raises(ValidationError) as e:
            _task(priority=bad)
        assert e.value.field == "priority" and e.value.status == 400
    fields = form_fields(b"task.url=http://example.com/&task.priority=8&x=1")
    assert fields["priority"] == "8" and fields["params"] == {"x": "1"}
    t = _task(priority=8)
    back = Task.decode(t.encode())
    assert back.priority == 8 and back.summary()["priority"] == 8
    assert "priority" not in _task().encode()  # the default is not stored
    for bad in (12, -1, True, "5"):
        with pytest.raises(DecodeError):
            Task.decode({**t.encode(), "priority": bad})
