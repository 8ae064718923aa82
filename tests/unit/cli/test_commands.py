"""The client commands against a real node in this process: ``miyamoto queue set|show|
reset`` (the other commands against node processes: tests/nodes/test_cli.py). The
command runs in a thread of gevent's pool, on plain blocking sockets, while the node
serves on this thread's loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import gevent
import pytest

from dispatchkit import wait_for
from miyamoto.cli import main as cli
from miyamoto.config.settings import load
from miyamoto.delivery import completion
from miyamoto.delivery.attempt import Outcome
from miyamoto.node import Node

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server(tmp_path: Path, monkeypatch) -> Iterator[Node]:
    ini = tmp_path / "m.ini"
    ini.write_text("[queue:mail]\nrate = 3\n")
    node = Node(load(str(ini), env={}, flags={"data_dir": str(tmp_path / "data"),
                                              "http": "127.0.0.1:0", "shutdown_timeout": 1}))
    node.start()
    wait_for(lambda: node.definitions.machine.ready, 10)
    monkeypatch.setenv("MIYAMOTO_SERVER", f"http://127.0.0.1:{node.http_port}")
    yield node
    node.stop()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = gevent.get_hub().threadpool.apply(cli.main, (list(argv),))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_queue_set_show_and_reset(server: Node, capsys) -> None:
    code, out, _ = run(capsys, "queue", "set", "mail", "burst=9", "paused=true", "timeout=2.5")
    assert code == 0
    shown = json.loads(out)
    assert (shown["config"]["burst"], shown["config"]["timeout"], shown["paused"]) == \
        (9, 2.5, True)
    assert server.engine.dispatcher.summary("mail")[1] is True
    code, out, _ = run(capsys, "queue", "set", "mail", "burst=null")
    assert code == 0 and json.loads(out)["sources"]["burst"] == "default"
    code, out, _ = run(capsys, "queue", "show", "mail")
    assert code == 0 and json.loads(out)["sources"] == {
        **{k: "default" for k in json.loads(out)["sources"]},
        "rate": "config", "paused": "api", "timeout": "api"}
    code, out, _ = run(capsys, "queue", "reset", "mail")
    assert code == 0 and json.loads(out)["paused"] is False
    assert server.definitions.machine.items("queue") == []


def test_queue_set_names_a_bad_setting(server: Node, capsys) -> None:
    code, _, err = run(capsys, "queue", "set", "mail", "rate=-1")
    assert code == 1 and "rate" in err and "(400)" in err
    code, _, err = run(capsys, "queue", "set", "mail", "colour=red")  # a word: the node's
    assert code == 1 and "colour" in err and "(400)" in err          # to judge, and name
    code, _, err = run(capsys, "queue", "set", "mail", "ordering_on_failure=sometimes")
    assert code == 1 and "ordering_on_failure" in err and "block" in err
    code, out, _ = run(capsys, "queue", "set", "strict", "ordering_on_failure=block")
    assert code == 0 and json.loads(out)["config"]["ordering_on_failure"] == "block"
    code, _, err = run(capsys, "queue", "set", "mail", "rate")
    assert code == 2 and "KEY=VALUE" in err
    code, _, err = run(capsys, "queue", "reset", "mail")  # nothing set through the API
    assert code == 1 and "(404)" in err
    code, _, err = run(capsys, "pause", "nosuchqueue")  # a control makes no queue
    assert code == 1 and "names no queue" in err and "(404)" in err


def test_enqueue_lifetime_flags_resend_and_schedule_run(server: Node, capsys) -> None:
    server.engine.pause("mail", True)  # nothing is delivered: the tasks stay as enqueued
    code, out, _ = run(capsys, "enqueue", "http://127.0.0.1:9/x", "--queue", "mail",
                       "--ttl", "300", "--retry-delays", "1,10,60")
    assert code == 0
    t = server.engine.get(json.loads(out)["id"])
    assert t.retry_delays == (1.0, 10.0, 60.0) and t.expires_at == pytest.approx(
        t.created + 300, abs=0.01)
    with pytest.raises(SystemExit) as exited:  # argparse's: before any request
        cli.main(["enqueue", "http://127.0.0.1:9/x", "--retry-delays", "1,x"])
    assert exited.value.code == 2 and "--retry-delays" in capsys.readouterr().err
    code, _, err = run(capsys, "enqueue", "http://127.0.0.1:9/x", "--retry-delays", "-1")
    assert code == 1 and "retry_delays[0]" in err and "(400)" in err
    code, _, err = run(capsys, "resend", t.id)  # not ended
    assert code == 1 and "(409)" in err
    server.engine.cancel(t.id)
    code, out, _ = run(capsys, "resend", t.id)
    assert code == 0 and json.loads(out)["state"] == "scheduled"
    assert server.engine.get(t.id).reruns == 1
    server.engine.cancel(t.id)
    code, out, _ = run(capsys, "resend", "--queue", "mail", "--state", "cancelled",
                       "--target", "http://127.0.0.1:9/")
    assert code == 0 and (json.loads(out)["count"], json.loads(out)["more"]) == (1, False)
    code, _, err = run(capsys, "resend", t.id, "--queue", "mail")
    assert code == 2 and "not both" in err
    code, _, err = run(capsys, "schedule", "run", "none")
    assert code == 1 and "(404)" in err


def test_a_long_task_enqueued_heartbeated_and_completed(server: Node, capsys) -> None:
    """``enqueue --lease``, then (its worker's 202 stood in by the engine's own outcome)
    ``heartbeat URL --lease`` and ``complete ID --completion-token`` with a result."""
    server.engine.pause("mail", True)
    code, out, _ = run(capsys, "enqueue", "http://127.0.0.1:9/x", "--queue", "mail",
                       "--lease", "120")
    assert code == 0
    tid = json.loads(out)["id"]
    assert server.engine.get(tid).lease == 120.0
    assert server.engine._begin(tid) is not None
    server.engine.finish(tid, Outcome(ok=True, status=202, at=server.clock(),
                                      start=server.clock()))
    token = completion.mint(server.engine.completion_key, tid, 0, 1, server.clock() + 600)
    url = completion.url(f"http://127.0.0.1:{server.http_port}", tid, token, "heartbeat")
    code, out, _ = run(capsys, "heartbeat", url, "--lease", "300", "--raw")
    assert code == 0 and json.loads(out)["lease_until"] > server.clock() + 290
    code, _, err = run(capsys, "complete", tid, "--completion-token", token[:-2] + "xx")
    assert code == 1 and "(403)" in err
    code, out, _ = run(capsys, "complete", tid, "--completion-token", token,
                       "--result", '{"rows": 3}')
    assert code == 0 and json.loads(out)["state"] == "succeeded"
    assert server.engine.get(tid).last["body"] == '{"rows":3}'
    code, _, err = run(capsys, "complete", tid, "--completion-token", token)
    assert code == 1 and "(409)" in err


def test_the_clis_states_are_the_servers() -> None:
    """The --state choices of tasks and browse spell the server's states (the CLI does not
    import the task module at start-up, so the list is its own and must not drift)."""
    from miyamoto.cli.commands import STATES
    from miyamoto.tasks.task import State

    assert set(STATES) == {s.value for s in State}
