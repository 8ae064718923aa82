"""Labels on a real node: set at enqueue (JSON and form), shown by GET /tasks/<id>, and
GET /tasks?label=k=v&since=&until= pages through them; a bad filter is a 400 naming it.
The plans (an index, no scan): tests/unit/store/test_journal.py."""

from __future__ import annotations

import time

import pytest

from helpers import NodeProcess, Sink


@pytest.mark.timeout(40)
def test_labels_are_shown_and_searched(node: NodeProcess, sink: Sink) -> None:
    url = sink.url_for("/x")
    now = time.time()
    ids = [node.enqueue(url=url, countdown=100 + i, labels={"team": "a" if i % 2 else "b"}
                        )["id"] for i in range(5)]
    r = node.post("/queue", data={"task.url": url, "task.countdown": "200",
                                  "task.labels": "team=a,env=prod"})
    assert r.status_code == 200, r.text
    ids.append(r.json()["id"])
    assert node.task(ids[5])["labels"] == {"team": "a", "env": "prod"}
    page = node.get("/tasks", params={"label": "team=a", "limit": 2}).json()
    assert [t["id"] for t in page["tasks"]] == [ids[1], ids[3]]
    rest = node.get("/tasks", params={"label": "team=a", "cursor": page["next_cursor"]}).json()
    assert [t["id"] for t in rest["tasks"]] == [ids[5]] and rest["next_cursor"] is None
    ranged = node.get("/tasks", params={"label": "team=a", "since": now + 102,
                                        "until": now + 150}).json()
    assert [t["id"] for t in ranged["tasks"]] == [ids[3]]
    assert [t["id"] for t in node.get("/tasks", params={"queue": "default", "label": "env=prod"}
                                      ).json()["tasks"]] == [ids[5]]
    for params, field in (({"label": "team"}, "label"), ({"since": "soon"}, "since")):
        bad = node.get("/tasks", params=params)
        assert bad.status_code == 400 and bad.json()["field"] == field, bad.text
    bad = node.post("/queue", json={"url": url, "labels": {"Team": "a"}})
    assert bad.status_code == 400 and bad.json()["field"] == "labels.Team"
