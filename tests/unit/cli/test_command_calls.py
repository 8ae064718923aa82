"""Every client command of ``miyamoto`` (``miyamoto.cli.commands`` through ``cli.main``): the
client call its arguments make, and how the client is built from the common flags, with a
recording client in place of ``miyamoto.client.Client``. Against a real node:
tests/nodes/test_cli.py and test_commands.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

import miyamoto.client
from miyamoto.cli import main as cli

pytestmark = pytest.mark.timeout(30)

ANSWERS: dict[str, Any] = {
    "cluster": {"node": "n1", "role": "leader", "leader": "n1", "term": 1, "version": 1,
                "members": [{"id": "n1"}]},
    "queues": [{"name": "default", "counts": {"failed": 2}}],
    "tasks": [], "browse": {"tasks": [], "next_cursor": None},
    "queue": {"name": "q", "counts": {"failed": 2}},
    "retry_failed": {"retried": 2, "more": False},
}


class Recorder:
    made: list[tuple[tuple, dict]] = []
    calls: list[tuple[str, tuple, dict]] = []

    def __init__(self, *args: Any, **kw: Any) -> None:
        Recorder.made.append((args, kw))

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            Recorder.calls.append((name, args, kw))
            return ANSWERS.get(name, {"called": name})
        return call


@pytest.fixture(autouse=True)
def recorder(monkeypatch) -> type[Recorder]:
    Recorder.made, Recorder.calls = [], []
    monkeypatch.setattr(miyamoto.client, "Client", Recorder)
    for var in ("MIYAMOTO_SERVER", "MIYAMOTO_TOKEN", "MIYAMOTO_API_TOKEN", "MIYAMOTO_CACERT",
                "MIYAMOTO_CLIENT_CERT", "MIYAMOTO_CLIENT_KEY"):
        monkeypatch.delenv(var, raising=False)
    return Recorder


def calls(capsys, *argv: str) -> list[tuple[str, tuple, dict]]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    return Recorder.calls


@pytest.mark.parametrize("argv, want", [
    (["task", "t-1"], [("get", ("t-1",), {})]),
    (["cancel", "t-1"], [("cancel", ("t-1",), {})]),
    (["retry", "t-1"], [("retry", ("t-1",), {})]),
    (["resend", "t-1"], [("resend", ("t-1",), {})]),
    (["resend", "--queue", "q", "--state", "expired", "--target", "http://w/",
      "--since", "100", "--until", "200"],
     [("resend_many", ("q",), {"state": "expired", "target": "http://w/", "since": 100.0,
                               "until": 200.0})]),
    (["find", "n1"], [("find", ("n1", "default"), {})]),
    (["find", "n1", "--queue", "q"], [("find", ("n1", "q"), {})]),
    (["tasks"], [("tasks", ("default", "scheduled", 100), {})]),
    (["tasks", "q", "--state", "failed", "--limit", "5"], [("tasks", ("q", "failed", 5), {})]),
    (["browse"], [("browse", ("scheduled",), {
        "queue": None, "target": None, "name_prefix": None, "label": None, "since": None,
        "until": None, "cursor": None, "limit": 50})]),
    (["pause", "q"], [("pause", ("q",), {})]),
    (["resume", "q"], [("resume", ("q",), {})]),
    (["purge", "q"], [("purge", ("q",), {})]),
    (["failed", "list"], [("tasks", ("default", "failed", 100), {})]),
    (["failed", "list", "q", "--limit", "7"], [("tasks", ("q", "failed", 7), {})]),
    (["failed", "retry", "q"], [("retry_failed", ("q",), {})]),
    (["targets"], [("targets", (), {})]),
    (["schedules"], [("schedules", (), {})]),
    (["schedule", "add", "s", "http://w/x", "a=1", "--every", "10", "--timezone",
      "Europe/Paris", "--catch-up", "none", "--queue", "q", "--method", "PUT",
      "--task-json", '{"priority": 7}'],
     [("schedule", ("s", {"priority": 7, "url": "http://w/x", "params": {"a": "1"},
                          "queue": "q", "method": "PUT"}),
       {"cron": None, "every": 10, "timezone": "Europe/Paris", "catch_up": "none",
        "cron_seconds_last": None})]),
    (["schedule", "add", "s", "http://w/x", "--cron", "0 3 * * * 30", "--cron-seconds-last"],
     [("schedule", ("s", {"url": "http://w/x"}),
       {"cron": "0 3 * * * 30", "every": None, "timezone": None, "catch_up": None,
        "cron_seconds_last": True})]),
    (["schedule", "show", "s"], [("get_schedule", ("s",), {})]),
    (["schedule", "delete", "s"], [("unschedule", ("s",), {})]),
    (["schedule", "pause", "s"], [("pause_schedule", ("s",), {})]),
    (["schedule", "resume", "s"], [("resume_schedule", ("s",), {})]),
    (["schedule", "run", "s"], [("run_schedule", ("s",), {})]),
    (["topics"], [("topics", (), {})]),
    (["topic", "put", "t", "http://a/", "http://b/"],
     [("put_topic", ("t", ["http://a/", "http://b/"]), {})]),
    (["topic", "show", "t"], [("topic", ("t",), {})]),
    (["topic", "delete", "t"], [("delete_topic", ("t",), {})]),
    (["topic", "publish", "t", "k=v", "--task-name", "n", "--queue", "q"],
     [("publish", ("t", {"k": "v"}), {"name": "n", "queue": "q"})]),
    (["topic", "publish", "t"], [("publish", ("t", None), {"name": None, "queue": None})]),
    (["queue", "set", "q", "rate=5", "paused=true", "burst=null"],
     [("set_queue", ("q",), {"rate": 5, "paused": True, "burst": None})]),
    # a value that is no JSON goes as a word: the node says whether the field takes it
    (["queue", "set", "q", "mode=pull", "rate=fast"],
     [("set_queue", ("q",), {"mode": "pull", "rate": "fast"})]),
    (["queue", "show", "q"], [("queue", ("q",), {})]),
    (["queue", "reset", "q"], [("reset_queue", ("q",), {})]),
    (["complete", "t-1"], [("complete", ("t-1", "succeeded", None), {"token": None})]),
    (["complete", "t-1", "--state", "failed", "--result", '{"n": 1}', "--completion-token",
      "ct"], [("complete", ("t-1", "failed", {"n": 1}), {"token": "ct"})]),
    (["heartbeat", "t-1"], [("heartbeat", ("t-1", None), {"token": None})]),
    (["heartbeat", "t-1", "--lease", "60", "--completion-token", "ct"],
     [("heartbeat", ("t-1", 60.0), {"token": "ct"})]),
])
def test_each_command_makes_its_call(capsys, argv: list[str], want: list) -> None:
    assert calls(capsys, *argv) == want


def test_enqueue_hands_every_flag_to_the_client(capsys) -> None:
    got = calls(capsys, "enqueue", "http://w/x", "a=1", "a=2", "b=3", "--method", "PUT",
                "--countdown", "5", "--queue", "q", "--name", "n", "-H", "X-A: 1",
                "--max-attempts", "3", "--timeout", "9", "--priority", "7", "--flow-key", "k",
                "--flow-rate", "2", "--flow-parallelism", "4", "--ttl", "60",
                "--retry-delays", "1,10", "--label", "team=a", "--on-duplicate", "replace",
                "--debounce", "5", "--debounce-max", "50", "--callback", "http://c/",
                "--failure-callback", "http://f/")
    assert got == [("enqueue", ("http://w/x", {"a": ["1", "2"], "b": "3"}), {
        "method": "PUT", "countdown": 5.0, "queue": "q", "name": "n", "headers": {"X-A": "1"},
        "max_attempts": 3, "timeout": 9.0, "priority": 7, "flow_key": "k", "flow_rate": 2.0,
        "flow_parallelism": 4, "ttl": 60.0, "retry_delays": [1.0, 10.0],
        "labels": {"team": "a"}, "on_duplicate": "replace", "debounce": 5.0,
        "debounce_max": 50.0, "callback": "http://c/", "failure_callback": "http://f/"})]
    Recorder.calls.clear()
    got = calls(capsys, "enqueue", "http://w/x", "--json", '{"a": 1}', "--async", "--lease",
                "60", "--dedupe", "content", "--expires-at", "2000000000")
    assert got == [("enqueue", ("http://w/x", None), {
        "json": {"a": 1}, "async": True, "lease": 60.0, "dedupe": "content",
        "expires_at": 2e9})]
    Recorder.calls.clear()
    got = calls(capsys, "enqueue", "http://w/x", "--body", "raw", "--content-type",
                "text/plain", "--eta", "1700000000")
    assert got == [("enqueue", ("http://w/x", None), {"body": "raw",
                                                      "content_type": "text/plain",
                                                      "eta": 1.7e9})]


def test_status_prints_tables_or_with_json_the_raw_answers(capsys) -> None:
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("node n1 (leader), leader n1") and "QUEUE" in out
    assert cli.main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"cluster": ANSWERS["cluster"],
                                                   "queues": ANSWERS["queues"]}


@pytest.mark.parametrize("argv, why", [
    (["resend"], "a task id, or --queue"),
    (["resend", "t-1", "--queue", "q"], "not both"),
    (["resend", "t-1", "--state", "failed"], "not both"),
    (["enqueue"], "a target URL (or --file) is required"),
    (["enqueue", "http://w/", "a=1", "--json", "{}"], "not both"),
    (["enqueue", "http://w/", "--json", "{"], "--json is not JSON"),
    (["enqueue", "http://w/", "novalue"], "is not key=value"),
    (["enqueue", "http://w/", "-H", "nocolon"], "is not 'Name: value'"),
    (["complete", "t-1", "--result", "{"], "--result is not JSON"),
    (["queue", "set", "q", "rate"], "is not KEY=VALUE"),
    (["schedule", "add", "s", "http://w/", "--every", "5", "--task-json", "["],
     "--task-json is not JSON"),
    (["schedule", "add", "s", "http://w/", "--every", "5", "--task-json", "[]"],
     "--task-json must be a JSON object"),
    (["task", "t-1", "--key", "k.pem"], "--key needs --cert"),
])
def test_a_usage_error_is_exit_2_naming_it_and_calls_nothing(capsys, argv, why) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"miyamoto {argv[0]}: ") and why in err, err
    assert Recorder.calls == []


def test_the_client_is_built_from_the_common_flags_or_their_variables(capsys,
                                                                     monkeypatch) -> None:
    calls(capsys, "task", "t", "--server", "a:1, https://b:2,", "--token", "tk",
          "--request-timeout", "3", "--cacert", "ca.pem", "--cert", "c.pem", "--key", "k.pem")
    assert Recorder.made[-1] == ((["http://a:1", "https://b:2"],),
                                 {"token": "tk", "timeout": 3.0, "ca": "ca.pem",
                                  "cert": ("c.pem", "k.pem")})
    calls(capsys, "task", "t")
    assert Recorder.made[-1] == ((["http://127.0.0.1:8088"],),
                                 {"token": None, "timeout": 30.0, "ca": None, "cert": None})
    monkeypatch.setenv("MIYAMOTO_SERVER", "http://s:9")
    monkeypatch.setenv("MIYAMOTO_API_TOKEN", "old")
    monkeypatch.setenv("MIYAMOTO_CACERT", "env-ca.pem")
    monkeypatch.setenv("MIYAMOTO_CLIENT_CERT", "both.pem")
    calls(capsys, "task", "t")
    assert Recorder.made[-1] == ((["http://s:9"],), {"token": "old", "timeout": 30.0,
                                                     "ca": "env-ca.pem", "cert": "both.pem"})
    monkeypatch.setenv("MIYAMOTO_TOKEN", "new")
    monkeypatch.setenv("MIYAMOTO_CLIENT_KEY", "env-k.pem")
    calls(capsys, "task", "t", "--server", ",")
    assert Recorder.made[-1] == ((["http://127.0.0.1:8088"],), {
        "token": "new", "timeout": 30.0, "ca": "env-ca.pem", "cert": ("both.pem", "env-k.pem")})


@pytest.mark.parametrize("error, said", [
    (miyamoto.client.DuplicateTask("taken", 409, {"id": "t-9"}),
     "miyamoto: duplicate: the name is taken by task t-9"),
    (miyamoto.client.DuplicateTask("taken", 409, {"tasks": [{"id": "a"}, "odd", {"id": "b"}]}),
     "miyamoto: duplicate: the names are taken by tasks a, b"),
    (miyamoto.client.DuplicateTask("taken", 409, {}), "miyamoto: duplicate: the name is taken"),
    (miyamoto.client.MiyamotoError("no  such\nqueue", 404), "miyamoto: no such queue (404)"),
    (miyamoto.client.MiyamotoError("x" * 400, None), "miyamoto: " + "x" * 297 + "..."),
    (miyamoto.client.MiyamotoError("y" * 300, None), "miyamoto: " + "y" * 300),
    (miyamoto.client.MiyamotoError("z" * 301, None), "miyamoto: " + "z" * 297 + "..."),
])
def test_a_refusal_is_one_line_and_exit_1(capsys, monkeypatch, error, said) -> None:
    def refuse(*args: Any, **kw: Any) -> Any:
        raise error
    monkeypatch.setitem(ANSWERS, "enqueue", None)
    monkeypatch.setattr(Recorder, "enqueue", lambda self, *a, **kw: refuse(), raising=False)
    assert cli.main(["enqueue", "http://w/", "--name", "n"]) == 1
    assert capsys.readouterr().err.splitlines() == [said]


def test_times_are_shown_in_rfc_3339_unless_raw(capsys, monkeypatch) -> None:
    monkeypatch.setitem(ANSWERS, "get", {"id": "t-1", "created": 1700000000.0})
    assert cli.main(["task", "t-1"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] == "2023-11-14T22:13:20Z"
    assert cli.main(["task", "t-1", "--raw"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] == 1700000000.0


@pytest.mark.parametrize("status, said", [
    (None, "miyamoto: refused"), (401, "miyamoto: refused (401)"),
    (403, "miyamoto: refused (403)"), (503, "miyamoto: refused (503)"),
    (404, "is not a Miyamoto node: GET /cluster answered 404")])
def test_status_tells_a_node_that_refused_from_something_that_is_no_node(
        capsys, monkeypatch, status, said) -> None:
    def cluster(self: Recorder) -> Any:
        raise miyamoto.client.MiyamotoError("refused", status)
    monkeypatch.setattr(Recorder, "cluster", cluster, raising=False)
    assert cli.main(["status"]) == 1
    assert said in capsys.readouterr().err
