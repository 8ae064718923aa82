"""Journal ownership and health on real node processes and real files.

- one node per data dir: a second exits 2 naming the holder's pid; a kill -9'd
  holder's lock does not block the next start;
- a journal file deleted under a running node is noticed, rebuilt in place, and no
  acknowledged task is lost after a restart;
- while the journal cannot write, /readyz and enqueues answer 503, and both recover
  by themselves. "Cannot write" is made real with RLIMIT_FSIZE set on the running
  node (prlimit): every write past the first byte of any file fails with EFBIG, as on
  a full disk (CPython ignores SIGXFSZ), and raising the limit again is the disk
  getting space back.

The journal's watcher on real files in this process (a replaced file, a removed data
dir, a lock taken by a rival): tests/unit/store/test_file.py.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

from helpers import NodeProcess, wait_until

JOURNAL = "journal.sqlite3"
LATER = 3600  # tasks that stay scheduled for the whole test


def _enqueue(node: NodeProcess, sink_url: str, i: int) -> tuple[int, str | None]:
    r = node.post("/queue", json={"url": f"{sink_url}/later", "countdown": LATER,
                                  "params": {"i": str(i)}}, timeout=5)
    return r.status_code, (r.json().get("id") if r.status_code == 200 else None)


def _acked(node: NodeProcess, sink_url: str, n: int, start: int = 0) -> list[str]:
    ids = []
    for i in range(start, start + n):
        status, task_id = _enqueue(node, sink_url, i)
        assert status == 200, status
        ids.append(task_id)
    return ids


def _all_scheduled(node: NodeProcess, ids: list[str]) -> list[str]:
    """The ids the node does not hold as scheduled."""
    missing = []
    for task_id in ids:
        r = node.get(f"/tasks/{task_id}")
        if r.status_code != 200 or r.json().get("state") != "scheduled":
            missing.append(task_id)
    return missing


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _readyz(node: NodeProcess) -> tuple[int, str]:
    r = node.get("/readyz", timeout=2)
    return r.status_code, r.json().get("reason", "")


class _FileSizeLimit:
    """RLIMIT_FSIZE on another process: set low, it cannot write; restore, it can."""

    def __init__(self, pid: int):
        self.pid = pid
        self.saved = resource.prlimit(pid, resource.RLIMIT_FSIZE)

    def choke(self) -> None:
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, (1, self.saved[1]))

    def restore(self) -> None:
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, self.saved)


# ================================================================ the data dir lock


@pytest.mark.timeout(40)
def test_a_second_node_on_the_data_dir_exits_2_naming_the_holder(node_factory, sink):
    first = node_factory("first")
    second = node_factory("second", data_dir=first.data_dir, ready=False)
    assert second.wait_exit(15) == 2, second.log_text(30)
    log = second.log_text()
    assert f"pid {first.pid}" in log and first.data_dir in log, log
    assert "Traceback" not in log, log
    # the first keeps working: it takes a task and delivers it
    first.enqueue(url=f"{sink.url}/still", params={"k": "v"})
    sink.wait_for(count=1, path="/still")
    assert first.get("/readyz").status_code == 200


@pytest.mark.timeout(40)
def test_a_kill_9_holder_does_not_block_the_next_start(node_factory, sink):
    first = node_factory("first")
    ids = _acked(first, sink.url, 5)
    first.kill()  # kill -9: no cleanup, the lock file stays with its pid in it
    lock = Path(first.data_dir) / "lock"
    assert lock.read_text().strip() == str(first.pid)
    again = node_factory("again", data_dir=first.data_dir)
    assert _all_scheduled(again, ids) == []
    assert lock.read_text().strip() == str(again.pid)


# ================================================================ the file deleted


@pytest.mark.timeout(60)
def test_a_deleted_journal_is_rebuilt_and_loses_no_acknowledged_task(node_factory, sink):
    """Before: the node went on acknowledging into the unlinked inode, and after a
    restart none of those tasks existed."""
    node = node_factory("n")
    path = Path(node.data_dir) / JOURNAL
    acked = _acked(node, sink.url, 50)
    old_inode = _inode(path)
    os.remove(path)
    deadline = time.monotonic() + 20
    i, refused = 50, 0
    while time.monotonic() < deadline and len(acked) < 250:  # bounded in count and time
        status, task_id = _enqueue(node, sink.url, i)
        i += 1
        assert status in (200, 503), status
        if task_id is not None:
            acked.append(task_id)
        else:
            refused += 1
    assert len(acked) == 250, (len(acked), refused)
    assert _inode(path) not in (None, old_inode), "the journal was not put back"
    assert _readyz(node)[0] == 200
    log = node.log_text()
    assert log.count("ERROR miyamoto.store.file: journal: its file was deleted") == 1, log
    assert log.count(" ERROR ") == 1, log  # once, not once per refused enqueue
    assert "rebuilt" in log, log[-3000:]
    node.kill()
    node.restart().wait_ready()
    assert _all_scheduled(node, acked) == []


@pytest.mark.timeout(60)
def test_a_deleted_journal_answers_503_until_it_can_be_rebuilt(node_factory, sink):
    node = node_factory("n")
    path = Path(node.data_dir) / JOURNAL
    acked = _acked(node, sink.url, 20)
    limit = _FileSizeLimit(node.pid)
    limit.choke()  # the rebuild cannot write its copy either
    try:
        os.remove(path)
        wait_until(lambda: _readyz(node) == (503, "journal: its file was deleted or replaced"),
                   10, what="/readyz to say the journal file is gone")
        assert _enqueue(node, sink.url, 99)[0] == 503
        assert node.get("/healthz").status_code == 200  # alive, just not ready
    finally:
        limit.restore()
    wait_until(lambda: _readyz(node)[0] == 200, 10, what="/readyz to recover")
    acked += _acked(node, sink.url, 20, start=100)
    assert _inode(path) is not None
    node.kill()
    node.restart().wait_ready()
    assert _all_scheduled(node, acked) == []


# ================================================================ cannot write


@pytest.mark.timeout(60)
def test_a_journal_that_cannot_write_answers_503_and_recovers_by_itself(node_factory, sink):
    node = node_factory("n")
    acked = _acked(node, sink.url, 10)
    due = node.enqueue(url=f"{sink.url}/during", countdown=2)["id"]
    node.enqueue("other", url=f"{sink.url}/other", countdown=3600)  # a pause makes no queue
    limit = _FileSizeLimit(node.pid)
    limit.choke()
    try:
        assert wait_until(lambda: _enqueue(node, sink.url, 99)[0] == 503, 10,
                          what="an enqueue to be refused")
        wait_until(lambda: _readyz(node) == (503, "journal: cannot write"), 10,
                   what="/readyz to say the journal cannot write")
        # a task due meanwhile is still delivered; its outcome waits in memory
        sink.wait_for(count=1, path="/during")
        assert _readyz(node)[0] == 503
        # reads still answer; writes are 503, never 500
        assert node.get("/queues").status_code == 200
        assert node.get("/queues/default/tasks?state=succeeded").status_code == 200
        assert node.get(f"/tasks/{acked[0]}").status_code == 200
        assert node.post("/queues/other/pause").status_code == 503
    finally:
        limit.restore()
    wait_until(lambda: _readyz(node)[0] == 200, 10, what="/readyz to recover by itself")
    acked += _acked(node, sink.url, 10, start=10)
    node.enqueue(url=f"{sink.url}/after")
    sink.wait_for(count=1, path="/after")
    node.kill()
    node.restart().wait_ready()
    assert _all_scheduled(node, acked) == []
    assert node.task(due)["state"] == "succeeded"  # written once the journal could write
    assert "Traceback" not in node.log_text(), node.log_text()
