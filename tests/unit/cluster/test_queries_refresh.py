"""A stale copy brought up to date (``Queries.refresh``): a sibling whose copy holds a
newer replace (``tasks/repeat.py``) sends it by the "replace" op to a copy that asked with
an older revision, so that copy takes the newer params, body and later eta before it asks
again. Two real engines (in-memory journals, clocks of their own), the op's arguments
through a JSON round trip as a peer's; only the request transport is a stub."""

from __future__ import annotations

from typing import Any

import pytest
import ujson

from enginekit import memory_engine
from miyamoto.cluster.queries import Queries
from miyamoto.tasks.task import Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0
SKEW = 0.25  # b's clock is ahead of a's: the eta travels as a delay


class Wire:
    """REQUESTs served by the named member's Queries, arguments as JSON."""

    def __init__(self) -> None:
        self.nodes: dict[str, Queries] = {}
        self.sent: list[tuple[str, str, dict]] = []

    def ask_all(self, members: list[str], op: str, args: dict, timeout: float) -> dict:
        out = {}
        for mem in members:
            self.sent.append((mem, op, args))
            out[mem] = self.nodes[mem].serve(op, ujson.loads(ujson.dumps(args)))
        return out


class Peers:
    def others(self) -> list[str]:
        return []

    def replay(self, task_id: str) -> None:
        pass


def _copy(replica: int, **kw: Any) -> Task:
    base = dict(id="t1", queue="q", url="http://w.example/x", created=NOW, name="n",
                replicas=("a", "b"), replica=replica)
    base.update(kw)
    return Task(**base)


def test_a_stale_copy_takes_the_newer_version_and_its_later_eta() -> None:
    wire = Wire()
    with memory_engine(NOW) as (ea, _), memory_engine(NOW + SKEW) as (eb, _):
        for me, engine in (("a", ea), ("b", eb)):
            wire.nodes[me] = Queries(me, engine, wire, Peers(),  # type: ignore[arg-type]
                                     timeout=1.0, offset=1.0, clock=engine.clock)
        # a holds the 8th replace (eta in 30 s); b came back from a kill -9 with the 2nd
        ea.add(_copy(0, params={"v": "8"}, body="eight", content_type="text/plain",
                     eta=NOW + 30, fire_at=NOW + 30, revision="0008.r8"))
        eb.add(_copy(1, params={"v": "2"}, body="two", eta=NOW + 5, fire_at=NOW + 6,
                     revision="0002.r2"))
        wire.nodes["a"].refresh("t1", "b")
        t = eb.get("t1")
        assert (t.params, t.body, t.content_type, t.revision) == \
            ({"v": "8"}, "eight", "text/plain", "0008.r8")
        assert t.eta == pytest.approx(NOW + SKEW + 30) and t.fire_at == pytest.approx(t.eta + 1)
        assert eb.journal.get("t1").revision == "0008.r8"  # durable: a restart keeps it
        # the other way round changes nothing: a newer copy is never pulled back
        wire.nodes["b"].refresh("t1", "a")
        assert ea.get("t1").params == {"v": "8"} and ea.get("t1").eta == NOW + 30


def test_a_copy_never_replaced_or_gone_sends_nothing() -> None:
    wire = Wire()
    with memory_engine(NOW) as (ea, _):
        wire.nodes["a"] = Queries("a", ea, wire, Peers(),  # type: ignore[arg-type]
                                  timeout=1.0, offset=1.0, clock=ea.clock)
        ea.add(_copy(0, eta=NOW + 30, fire_at=NOW + 30))
        wire.nodes["a"].refresh("t1", "b")
        wire.nodes["a"].refresh("nope", "b")
        assert wire.sent == []


def test_a_started_copy_sends_nothing() -> None:
    """Its eta is a retry's and a replace would be refused: the asker waits for it."""
    wire = Wire()
    with memory_engine(NOW) as (ea, _):
        wire.nodes["a"] = Queries("a", ea, wire, Peers(),  # type: ignore[arg-type]
                                  timeout=1.0, offset=1.0, clock=ea.clock)
        ea.add(_copy(0, eta=NOW + 30, fire_at=NOW + 60, attempts=1, revision="0008.r8"))
        wire.nodes["a"].refresh("t1", "b")
        assert wire.sent == []
