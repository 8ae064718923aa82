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
"""

from __future__ import annotations

import fcntl
import os
import resource
import shutil
import sqlite3
import time
from pathlib import Path

import gevent
import pytest

from helpers import NodeProcess, wait_until
from miyamoto.store import journal as journal_mod
from miyamoto.errors import Unavailable
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import Task

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


# ================================================================ in-process, real SQLite files


def _jtask(i: int) -> Task:
    return Task(id=f"t{i}", queue="q", url="http://127.0.0.1:9/", eta=1e12, fire_at=1e12,
                created=1.0)


def _wait_for(condition, timeout: float = 5.0) -> None:
    """Yield to the hub until ``condition()`` holds; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        gevent.sleep(0.01)


@pytest.fixture
def fast_watch(monkeypatch):
    monkeypatch.setattr(journal_mod, "WATCH_INTERVAL", 0.05)


def _reopened_ids(data_dir: Path) -> list[str]:
    again = Journal(str(data_dir))
    again.open()
    try:
        return sorted(t.id for t in again.load()[0])
    finally:
        again.close()


@pytest.mark.timeout(30)
def test_a_replaced_journal_is_kept_aside_and_ours_put_back(tmp_path, fast_watch):
    journal = Journal(str(tmp_path))
    journal.open()
    for i in range(5):
        journal.put(_jtask(i), wait=True)
    path = tmp_path / JOURNAL
    other = tmp_path / "other.sqlite3"
    sqlite3.connect(other).executescript("CREATE TABLE mine (x); INSERT INTO mine VALUES (7);")
    os.replace(other, path)
    replaced_inode = _inode(path)
    _wait_for(lambda: _inode(path) != replaced_inode and journal.health.ok)
    journal.put(_jtask(5), wait=True)
    journal.close()
    (aside,) = tmp_path.glob(JOURNAL + ".replaced-*")
    assert sqlite3.connect(aside).execute("SELECT x FROM mine").fetchall() == [(7,)]
    assert _reopened_ids(tmp_path) == [f"t{i}" for i in range(6)]


@pytest.mark.timeout(30)
def test_a_removed_data_dir_is_made_again_with_its_lock(tmp_path, fast_watch):
    data = tmp_path / "data"
    journal = Journal(str(data))
    journal.open()
    journal.put(_jtask(1), wait=True)
    shutil.rmtree(data)
    _wait_for(lambda: (data / JOURNAL).exists() and journal.health.ok)
    assert (data / "lock").read_text().strip() == str(os.getpid())
    journal.put(_jtask(2), wait=True)
    journal.close()
    assert _reopened_ids(data) == ["t1", "t2"]


@pytest.mark.timeout(30)
def test_a_lock_taken_by_another_process_stops_the_writes(tmp_path, fast_watch):
    """The lock file is replaced and someone else locks the new one (a second node
    started while ours ran): writing on would mix two nodes in one journal."""
    journal = Journal(str(tmp_path))
    journal.open()
    journal.put(_jtask(1), wait=True)
    lock = tmp_path / "lock"
    os.remove(lock)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)  # another open file description: a rival
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"4242\n")
        _wait_for(lambda: journal.health.problem == journal_mod.LOCK_LOST)
        with pytest.raises(Unavailable):
            journal.put(_jtask(2), wait=True)
    finally:
        os.close(fd)  # the rival exits
    _wait_for(lambda: journal.health.ok)
    assert lock.read_text().strip() == str(os.getpid())
    journal.put(_jtask(3), wait=True)
    journal.close()
    assert _reopened_ids(tmp_path) == ["t1", "t2", "t3"]  # t2 was kept queued, then written
