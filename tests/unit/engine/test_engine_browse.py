"""``Engine.browse`` on a real journal file: pages of first copies under a cursor, to
the end, with filters read from the raw rows; an ended state from the journal alone.
(The pure parts: test_browse.py; the journal's range reads: tests/unit/store.)"""

from __future__ import annotations

import pytest

from miyamoto.config import settings as config_mod
from miyamoto.engine import browse
from miyamoto.engine.engine import Engine
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def engine(tmp_path):
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path)})
    journal = Journal(str(tmp_path))
    journal.open()
    copies = [Task(id=f"t{i:03d}", queue="q" if i % 3 else "r", url=f"http://h{i % 2}:1/x",
                   name=f"inv-{i}" if i < 20 else None, eta=1e12 + i, fire_at=1e12 + i,
                   created=1.0, replica=0 if i % 4 else 1, replicas=("a", "b"))
              for i in range(40)]
    copies.append(copies[5].evolve(id="f1", state=State.FAILED, finished=5.0))
    journal.put_many(copies, wait=True)
    yield Engine(cfg, journal)
    journal.close()


def pages(engine: Engine, flt: browse.Filter, limit: int) -> list[list[str]]:
    out, after = [], None
    while True:
        page = engine.browse(flt, after, limit)
        out.append([s["id"] for _, s in page.items])
        if page.frontier is None:
            return out
        after = page.frontier
        assert len(out) < 50, out


def test_pages_of_first_copies_end_and_miss_none(engine: Engine) -> None:
    firsts = [f"t{i:03d}" for i in range(40) if i % 4]
    got = pages(engine, browse.Filter(State.SCHEDULED), 7)
    assert [i for p in got for i in p] == firsts and all(len(p) <= 7 for p in got)
    got = pages(engine, browse.Filter(State.SCHEDULED, queue="r", target="http://h1:1",
                                      name_prefix="inv-1"), 2)
    # r: i % 3 == 0; h1: odd i; inv-1, inv-10..19; a first copy: 15 only (12 is even, 18 too)
    assert [i for p in got for i in p] == ["t015"]
    assert pages(engine, browse.Filter(State.FAILED), 5) == [["f1"]]
    assert pages(engine, browse.Filter(State.RUNNING), 5) == [[]]


def test_a_filter_nothing_matches_reads_a_bounded_slice_and_moves_on(engine: Engine,
                                                                     monkeypatch) -> None:
    monkeypatch.setattr(browse, "SCAN_ROWS", 10)
    got = pages(engine, browse.Filter(State.SCHEDULED, name_prefix="nobody"), 5)
    assert got == [[], [], [], [], []]  # 40 rows, 10 a page, then the end


def test_running_copies_page_from_memory_under_a_cursor(engine: Engine) -> None:
    for i in (1, 2, 3, 5, 6, 8):  # t008 is a second copy: not listed
        t = engine.live.get(f"t{i:03d}")
        engine.live[t.id] = t.evolve(state=State.RUNNING)  # an attempt started
    got = pages(engine, browse.Filter(State.RUNNING), 2)
    assert [i for p in got for i in p] == ["t001", "t002", "t003", "t005", "t006"]
    assert all(len(p) <= 2 for p in got) and len(got) >= 3
    assert pages(engine, browse.Filter(State.RUNNING, queue="r"), 2) == [["t003", "t006"], []]
