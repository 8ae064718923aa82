"""Browsing tasks a page at a time (``miyamoto.engine.browse``): one node's page from
the rows it read, the cluster's merge up to the nearest frontier, the cursor, and a
peer's pages and filters checked. Pure: rows and pages are built by hand; the journal's
side (the range reads and their plans) is in tests/unit/store/test_journal.py."""

from __future__ import annotations

import pytest

from miyamoto.engine import browse
from miyamoto.engine.browse import Filter, Page
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)


def task(i: int, **kw) -> Task:
    base = dict(id=f"t{i:03d}", queue="q", url="http://w:1/x", eta=float(i), fire_at=float(i))
    base.update(kw)
    return Task(**base)


def rows(*tasks: Task) -> list[tuple[float, Task]]:
    return [(t.fire_at, t) for t in tasks]


def ids(items) -> list[str]:
    return [s["id"] for s in items]


def test_a_node_s_page_keeps_first_copies_that_match_every_filter() -> None:
    got = [task(1), task(2, replica=1, replicas=("a", "b")), task(3, name="mail-1"),
           task(4, url="http://other:1/x", name="mail-2"), task(5, name="sms-1"),
           task(6, state=State.RUNNING)]
    page = browse.local_page(rows(*got), None, Filter(State.SCHEDULED), 10)
    assert [k[1] for k, _ in page.items] == ["t001", "t003", "t004", "t005"]
    assert page.frontier is None  # read to the end
    page = browse.local_page(rows(*got), None,
                             Filter(State.SCHEDULED, target="http://w:1", name_prefix="mail"), 10)
    assert ids(s for _, s in page.items) == ["t003"]


def test_a_label_filter_keeps_the_tasks_whose_label_has_that_value() -> None:
    got = [task(1, labels={"team": "a"}), task(2, labels={"team": "b"}), task(3),
           task(4, labels={"team": "a", "env": "prod"}), task(5, labels={"env": "a"}),
           task(6, labels={"team": "a"}, queue="other")]
    page = browse.local_page(rows(*got), None, Filter(State.SCHEDULED, label=("team", "a")), 10)
    assert ids(s for _, s in page.items) == ["t001", "t004", "t006"]
    page = browse.local_page(rows(*got), None,
                             Filter(State.SCHEDULED, queue="q", label=("team", "a")), 10)
    assert ids(s for _, s in page.items) == ["t001", "t004"]


def test_a_node_s_page_stops_at_its_limit_or_where_it_stopped_reading() -> None:
    got = rows(*(task(i) for i in range(6)))
    full = browse.local_page(got, (5.0, "t005"), Filter(State.SCHEDULED), 2)
    assert [k for k, _ in full.items] == [(0.0, "t000"), (1.0, "t001")]
    assert full.frontier == (1.0, "t001")
    # nothing matched in the rows it read, but there are more: a short page, a cursor on
    none = browse.local_page(got, (5.0, "t005"), Filter(State.SCHEDULED, name_prefix="zz"), 2)
    assert none.items == [] and none.frontier == (5.0, "t005")


def test_a_row_is_decoded_only_if_its_raw_record_may_match() -> None:
    from miyamoto.store.rows import task_row
    t = task(1, name="mail-ü/1", url="http://w:1/x")
    data = task_row(t)[6]
    for flt, kept in ((Filter(State.SCHEDULED), True),
                      (Filter(State.SCHEDULED, name_prefix="mail-ü"), True),
                      (Filter(State.SCHEDULED, name_prefix="mail-ü/1"), True),
                      (Filter(State.SCHEDULED, name_prefix="sms"), False),
                      (Filter(State.SCHEDULED, target="http://w:1/"), True),
                      (Filter(State.SCHEDULED, target="http://v"), False)):
        assert flt.keeps_raw(0, data) is kept, flt
        assert flt.keeps(t) is kept, flt  # the same answer as the decoded check
    assert not Filter(State.SCHEDULED).keeps_raw(1, data)  # not a first copy
    # a record written with escaped slashes is decoded and judged whole
    assert Filter(State.SCHEDULED, target="http://v").keeps_raw(0, data.replace("/", "\\/"))


def summary(i: int, at: float) -> tuple[browse.Key, dict]:
    return ((at, f"t{i:03d}"), {"id": f"t{i:03d}"})


def test_the_cluster_s_page_stops_at_the_nearest_frontier() -> None:
    # a read to 5.0 and holds more; b read everything it has
    a = Page([summary(1, 1.0), summary(5, 5.0)], (5.0, "t005"))
    b = Page([summary(2, 2.0), summary(7, 7.0), summary(9, 9.0)], None)
    tasks, cursor = browse.merge([a, b], 10, descending=False)
    assert ids(tasks) == ["t001", "t002", "t005"] and cursor == (5.0, "t005")
    # the next page, from the cursor: a has nothing more, b its last two
    tasks, cursor = browse.merge([Page([], None), Page([summary(7, 7.0), summary(9, 9.0)],
                                                       None)], 10, descending=False)
    assert ids(tasks) == ["t007", "t009"] and cursor is None
    tasks, cursor = browse.merge([a, b], 2, descending=False)
    assert ids(tasks) == ["t001", "t002"] and cursor == (2.0, "t002")


def test_ended_tasks_are_merged_latest_first() -> None:
    a = Page([summary(1, 9.0), summary(2, 4.0)], (4.0, "t002"))
    b = Page([summary(3, 8.0), summary(4, 1.0)], None)
    tasks, cursor = browse.merge([a, b], 10, descending=True)
    assert ids(tasks) == ["t001", "t003", "t002"] and cursor == (4.0, "t002")


def test_a_cursor_round_trips_and_a_forged_one_is_refused() -> None:
    for key in ((1733100000.123456, "7e998f34-bed7-44f4-80cd-49620b0ab562"), (0.0, "a")):
        assert browse.decode_cursor(browse.encode_cursor(key)) == key
    assert browse.encode_cursor(None) is None
    for bad in ("", "1.0", "x~a", "1.0~", "nan~a", "inf~a", "1e300~a", "1.0~a/b", "1.0~" + "a" * 200):
        assert browse.decode_cursor(bad) is None, bad


def test_a_peer_s_page_and_filter_are_checked() -> None:
    page = Page([summary(1, 1.0)], (1.0, "t001"))
    assert browse.page_of(browse.page_payload(page)) == page
    for bad in (None, [], {"items": 3}, {"items": [], "frontier": [1.0]},
                {"items": [], "frontier": ["x", "a"]}):
        assert browse.page_of(bad) is None, bad
    # items that do not fit are left out, one by one: a bad key, another task's id
    got = browse.page_of({"items": [[[1.0, "t001"], {"id": "t001"}], [[1.0, "t002"], {"id": "t9"}],
                                    [["1", "t003"], {"id": "t003"}], "junk"], "frontier": None})
    assert got == Page([((1.0, "t001"), {"id": "t001"})], None)
    flt = Filter(State.FAILED, "q", "http://w", "mail")
    assert browse.filter_of(flt.payload()) == flt
    flt = Filter(State.FAILED, "q", None, None, ("team", "a"), 10.0, 20.0)
    assert browse.filter_of(flt.payload()) == flt
    for bad in (None, {"state": "lost"}, {"state": "failed", "queue": "a/b"},
                {"state": "failed", "target": 7}, {"state": "failed", "name_prefix": ""},
                {"state": "failed", "label": ["Team", "a"]}, {"state": "failed", "label": "a"},
                {"state": "failed", "since": "1"}, {"state": "failed", "until": 1e13}):
        assert browse.filter_of(bad) is None, bad
