"""The task record: its ids, states, defaults, public view, bounded history, and the
encode/decode of the journal row and the STORE payload. ``decode`` reads a peer's or the
journal's bytes, so every malformed field is a DecodeError, never a bad Task."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest

from miyamoto.tasks.task import CLOUDTASKS, HISTORY_ERROR_CHARS, HISTORY_MAX, LAST_BODY_BYTES, State, Task, \
    add_attempt, new_id
from miyamoto.wire import checks
from miyamoto.wire.verbs import DecodeError

pytestmark = pytest.mark.timeout(30)

ROW = {"id": "t-1", "queue": "q", "url": "http://127.0.0.1/", "method": "POST",
       "eta": 5.0, "fire_at": 5.0}
ENTRY = {"start": 1.5, "duration": 0.25, "node": "a", "status": 500, "error": None}


def full() -> Task:
    """A task with every field away from its default."""
    return Task(id="t-2", queue="q2", url="http://127.0.0.1/x", method="PUT",
                params={"k": "v"}, body="raw", content_type="text/plain",
                headers={"X-A": "b"}, name="n", eta=10.0, max_attempts=3, timeout=2.5,
                callback="http://127.0.0.1/cb", failure_callback="http://127.0.0.1/fb",
                priority=1, flow_key="k", flow_rate=2.0, flow_parallelism=3, created=9.0,
                state=State.FAILED, fire_at=11.0, attempts=2, executions=1,
                first_attempt=10.5, last={"status": 500}, history=(ENTRY,), finished=12.0,
                replicas=("a", "b"), replica=1, reruns=4)


def test_new_ids_are_random_uuid4_strings() -> None:
    ids = {new_id() for _ in range(200)}
    assert len(ids) == 200
    for i in ids:
        u = uuid.UUID(i)
        assert u.version == 4 and u.variant == uuid.RFC_4122 and str(u) == i


def test_ended_states() -> None:
    assert [s for s in State if s.ended] == [State.SUCCEEDED, State.FAILED, State.CANCELLED,
                                             State.EXPIRED]


def test_the_documented_bounds() -> None:
    """README: the first 4 KiB of the last body; the last 20 attempts; an error cut to 200
    characters, which is also what a peer's copy may carry (wire.checks)."""
    assert (LAST_BODY_BYTES, HISTORY_MAX, HISTORY_ERROR_CHARS) == (4096, 20, 200)
    assert checks.MAX_ERROR == HISTORY_ERROR_CHARS


def test_a_minimal_row_decodes_to_the_defaults() -> None:
    """An old journal row, or a peer's copy, holds only what differs from the defaults."""
    t = Task.decode(dict(ROW))
    assert t == Task(id="t-1", queue="q", url="http://127.0.0.1/", eta=5.0, fire_at=5.0)
    assert (t.state, t.priority, t.attempts, t.executions, t.replica, t.reruns,
            t.created, t.params, t.headers, t.replicas, t.history) == (
        State.SCHEDULED, 5, 0, 0, 0, 0, 0.0, {}, {}, (), ())  # README: priority 5
    bare = Task(id="i", queue="q", url="u")
    assert (bare.eta, bare.fire_at, bare.created, bare.method) == (0.0, 0.0, 0.0, "POST")
    assert isinstance(Task.decode(dict(ROW, eta=0)).eta, float)


def test_encode_leaves_out_defaults_and_round_trips() -> None:
    t = Task.decode(dict(ROW))
    assert t.encode() == dict(ROW, state="scheduled")
    f = full()
    row = f.encode()
    assert row["replicas"] == ["a", "b"] and row["history"] == [ENTRY]
    assert row["state"] == "failed"
    assert Task.decode(row) == f
    assert list(row)[:4] == ["id", "queue", "url", "method"]  # field order


def test_evolve_changes_only_what_it_is_given() -> None:
    f = full()
    g = f.evolve(state=State.SCHEDULED, attempts=0)
    assert (g.state, g.attempts) == (State.SCHEDULED, 0)
    assert g.evolve(state=f.state, attempts=f.attempts) == f
    assert f.state == State.FAILED  # the old record is untouched
    assert f.evolve() == f and f.evolve() is not f
    with pytest.raises(TypeError, match="no field 'nope'"):
        f.evolve(nope=1)


def test_summary_is_the_public_view() -> None:
    f = full()
    s = f.summary()
    assert s["state"] == "failed" and s["next_attempt"] is None
    assert s["history"] == [ENTRY] and s["replicas"] == ["a", "b"] and s["replica"] == 1
    assert (s["id"], s["queue"], s["name"], s["url"], s["method"], s["priority"],
            s["flow_key"], s["flow_rate"], s["flow_parallelism"]) == (
        "t-2", "q2", "n", "http://127.0.0.1/x", "PUT", 1, "k", 2.0, 3)
    assert s["last_response"] == {"status": 500} and s["finished"] == 12.0
    assert f.evolve(state=State.SCHEDULED).summary()["next_attempt"] == 11.0
    two = f.evolve(history=(dict(ENTRY, start=1.0), dict(ENTRY, start=2.0)))
    assert [h["start"] for h in two.summary()["history"]] == [2.0, 1.0]  # newest first


def test_history_is_bounded_and_an_attempt_is_added_once() -> None:
    history: tuple = ()
    for i in range(HISTORY_MAX + 5):
        history = add_attempt(history, dict(ENTRY, start=float(i)))
    assert len(history) == HISTORY_MAX and history[0]["start"] == 5.0
    assert history[-1]["start"] == float(HISTORY_MAX + 4)
    assert add_attempt(history, dict(history[-1])) is history  # a repeated report: once
    assert add_attempt(history, dict(history[0])) is history
    # the same start on another node is another attempt
    assert add_attempt(history, dict(history[-1], node="b"))[-1]["node"] == "b"
    short = add_attempt((ENTRY,), dict(ENTRY, start=2.0))
    assert [a["start"] for a in short] == [1.5, 2.0]


def test_history_survives_encode_and_decode_and_bad_entries_are_dropped() -> None:
    history = tuple(dict(ENTRY, start=float(i)) for i in range(3))
    t = Task(id="t", queue="q", url="http://127.0.0.1/", history=history)
    assert Task.decode(t.encode()).history == history
    row = dict(t.encode(), history=[ENTRY, {"start": "bad"}, 7])
    assert Task.decode(row).history == (ENTRY,)


BAD_ROWS: list[tuple[Any, str]] = [
    ([], "not an object"),
    (dict(ROW, nope=1), "unknown fields"),
    ({k: v for k, v in ROW.items() if k != "queue"}, "'queue' is missing"),
    (dict(ROW, url=5), "'url' is missing or of the wrong type"),
    (dict(ROW, eta=True), "'eta' is missing or of the wrong type"),
    (dict(ROW, body=5), "'body' is of the wrong type"),
    (dict(ROW, attempts=True), "'attempts' is of the wrong type"),
    (dict(ROW, timeout="5"), "'timeout' is of the wrong type"),
    (dict(ROW, method="BREW"), "bad method"),
    (dict(ROW, params=[]), "params is not an object"),
    (dict(ROW, headers={"a": 5}), "header values are not strings"),
    (dict(ROW, state="lost"), "malformed task"),
    (dict(ROW, replicas="ab"), "replicas are not a list"),
    (dict(ROW, replicas=["a", 5]), "replicas are not a list"),
    (dict(ROW, eta=math.inf), "'eta' is not finite"),
    (dict(ROW, fire_at=math.nan), "'fire_at' is not finite"),
    (dict(ROW, created=-math.inf), "'created' is not finite"),
    (dict(ROW, replicas=["a", "b"], replica=2), "replica index is out of range"),
    (dict(ROW, replicas=["a", "b"], replica=-1), "replica index is out of range"),
    (dict(ROW, max_attempts=0), "max_attempts is below 1"),
    (dict(ROW, timeout=0), "timeout is out of range"),
    (dict(ROW, timeout=86400.5), "timeout is out of range"),
    (dict(ROW, priority=10), "priority is out of range"),
    (dict(ROW, face="qstash-ish"), "face is not known"),
    (dict(ROW, face=1), "'face' is of the wrong type"),
    (dict(ROW, traceparent="00-" + "a" * 32 + "-" + "0" * 16 + "-01"), "not a W3C traceparent"),
    (dict(ROW, traceparent=5), "'traceparent' is of the wrong type"),
    (dict(ROW, oidc_audience="a b"), "oidc_audience is not an audience"),
    (dict(ROW, oidc_audience=""), "oidc_audience is not an audience"),
    (dict(ROW, oidc_audience="x" * 2084), "oidc_audience is not an audience"),
    (dict(ROW, oidc_audience=["x"]), "'oidc_audience' is of the wrong type"),
    (dict(ROW, expires_at="soon"), "'expires_at' is of the wrong type"),
    (dict(ROW, expires_at=math.inf), "expires_at is not finite"),
    (dict(ROW, retry_delays=[1, -1]), "retry_delays is not a short list"),
    (dict(ROW, retry_delays=[1] * 21), "retry_delays is not a short list"),
    (dict(ROW, retry_delays=[True]), "retry_delays is not a short list"),
    (dict(ROW, retry_delays=5), "'retry_delays' is of the wrong type"),
    (dict(ROW, lease=0), "lease is out of range"),
    (dict(ROW, lease=8 * 86400), "lease is out of range"),
    (dict(ROW, state="gone"), "malformed task"),
]


def test_the_face_a_task_came_through_survives_encode_and_decode() -> None:
    t = Task.decode(ROW).evolve(face=CLOUDTASKS)
    assert t.encode()["face"] == CLOUDTASKS and Task.decode(t.encode()) == t
    assert "face" not in Task.decode(ROW).encode()  # a native task's row is as it was


@pytest.mark.parametrize("row,why", BAD_ROWS)
def test_a_malformed_row_is_a_decode_error_that_says_why(row: Any, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        Task.decode(row)


@pytest.mark.parametrize("changes", [
    {"replicas": ["a", "b"], "replica": 0}, {"replicas": ["a", "b"], "replica": 1},
    {"replica": 3},  # no replicas (an old row): any index
    {"max_attempts": 1}, {"timeout": 86400}, {"timeout": 0.001}, {"params": {"a": 1}},
    {"headers": {"a": "b"}}, {"eta": 0}, {"created": 3},
    {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    {"oidc_audience": "https://worker.example/hook"}, {"oidc_audience": "x" * 2083},
    {"expires_at": 5.5}, {"retry_delays": [1, 10.5, 60]}, {"state": "expired"},
    {"lease": 3600}])
def test_the_edges_of_a_good_row_decode(changes: dict) -> None:
    t = Task.decode(dict(ROW, **changes))
    for k, v in changes.items():
        got = getattr(t, k)
        assert (list(got) if isinstance(got, tuple) else got) == v


def test_a_copys_revision_stamp_is_at_most_80_characters() -> None:
    """A replace's stamp (20 digits, a dot, the repeat's id) from a peer or the journal."""
    stamp = "0" * 20 + "." + "r" * 59
    assert Task.decode(dict(ROW, revision=stamp)).revision == stamp
    with pytest.raises(DecodeError, match="revision is too long"):
        Task.decode(dict(ROW, revision=stamp + "r"))
