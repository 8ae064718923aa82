"""A bulk retry, delete or resend counts each task once over the cluster, whichever of
its copies the nodes touched (a first copy's node down, two first copies after a
restore and a restart)."""

import pytest

from miyamoto.cluster.queries import bulk_total

pytestmark = pytest.mark.timeout(10)


def test_a_task_touched_on_several_nodes_counts_once():
    mine = {"count": 1, "more": False, "ids": ["a", "b"]}  # a: first copy here; b: second
    replies = {"n2": {"count": 1, "more": False, "ids": ["b", "c"]},  # b's first copy
               "n3": {"count": 0, "more": False, "ids": ["a", "c"]}}  # c's first is down
    assert bulk_total(mine, replies) == {"count": 3, "more": False}


def test_more_from_any_node_and_an_older_peers_count():
    mine = {"count": 0, "more": False, "ids": []}
    replies = {"old": {"count": 4, "more": False},  # a node from before ids: its count
               "n3": {"count": 2, "more": True, "ids": ["x", "y"]}}
    assert bulk_total(mine, replies) == {"count": 6, "more": True}


@pytest.mark.parametrize("reply", [None, [], "7", {"count": "2", "more": False},
                                   {"count": 2, "more": 1}, {"count": True, "more": False}])
def test_a_reply_that_does_not_fit_is_left_out(reply):
    mine = {"count": 1, "more": False, "ids": ["a"]}
    assert bulk_total(mine, {"bad": reply}) == {"count": 1, "more": False}


def test_ids_that_are_not_strings_fall_back_to_the_count():
    mine = {"count": 1, "more": False, "ids": ["a"]}
    reply = {"count": 2, "more": False, "ids": ["a", 5]}
    assert bulk_total(mine, {"n2": reply}) == {"count": 3, "more": False}
