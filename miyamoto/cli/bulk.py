"""``miyamoto enqueue --file tasks.jsonl``: many tasks through the batch route.

The file is read and checked whole before anything is sent (one JSON object per line,
blank lines skipped), so a typo on line 400 does not leave 399 tasks stored. Tasks go
in chunks of at most ``chunk`` tasks and ``MAX_CHUNK_BYTES`` of JSON (the node's
default body limit is 1 MiB), one chunk per queue at a time: the batch route takes one
queue, from its path. A chunk the node rejects (a bad field) stops the run with the
line it came from; chunks already sent stay stored. A progress bar (tqdm) is drawn on
stderr only when stderr is a terminal, so piped and scripted runs stay quiet.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Iterator

from tqdm import tqdm

from miyamoto.client import Client, InvalidTask

MAX_CHUNK_BYTES = 512 * 1024
_TASK_INDEX = re.compile(r"tasks\[(\d+)\](.*)")


class BadFile(ValueError):
    """The file is not JSON lines of task objects (a usage error: exit 2)."""


@dataclass
class Line:
    number: int
    task: dict[str, Any]


@dataclass
class Outcome:
    """What a bulk run did, by the answers' ``status``; ``errors`` says why, per line."""
    counts: dict[str, int] = field(default_factory=lambda: {"scheduled": 0, "duplicate": 0,
                                                            "error": 0})
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.counts["duplicate"] == 0 and self.counts["error"] == 0


def read_lines(stream: IO[str], default_queue: str | None) -> list[Line]:
    """Every task of the file, each with the queue it goes to set; BadFile if any line
    is not a JSON object."""
    out: list[Line] = []
    for n, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            task = json.loads(text)
        except ValueError as e:
            raise BadFile(f"line {n}: not JSON ({e})") from None
        if not isinstance(task, dict):
            raise BadFile(f"line {n}: not a JSON object")
        if default_queue and task.get("queue") is None:
            task["queue"] = default_queue
        out.append(Line(n, task))
    if not out:
        raise BadFile("holds no tasks")
    return out


def chunks(lines: list[Line], size: int) -> Iterator[tuple[str, list[Line]]]:
    """(queue, lines) in file order within each queue, bounded in count and bytes."""
    by_queue: dict[str, list[Line]] = {}
    for line in lines:
        q = line.task.get("queue")
        by_queue.setdefault(q if isinstance(q, str) else "default", []).append(line)
    for queue, items in by_queue.items():
        chunk: list[Line] = []
        used = 0
        for line in items:
            n = len(json.dumps(line.task, ensure_ascii=False)) + 2
            if chunk and (len(chunk) >= size or used + n > MAX_CHUNK_BYTES):
                yield queue, chunk
                chunk, used = [], 0
            chunk.append(line)
            used += n
        if chunk:
            yield queue, chunk


def run(client: Client, lines: list[Line], size: int, progress: bool | None = None) -> Outcome:
    """Send every line; the bar shows tasks answered. InvalidTask (a chunk refused)
    propagates with the offending line number in its message."""
    if progress is None:
        progress = sys.stderr.isatty()
    outcome = Outcome()
    bar = _bar(len(lines)) if progress else None
    try:
        for queue, chunk in chunks(lines, size):
            try:
                results = client.enqueue_batch([line.task for line in chunk], queue=queue)
            except InvalidTask as e:
                e.message = _locate(e, chunk)
                e.args = (e.message,)
                raise
            for line, r in zip(chunk, results):
                status = r.get("status") if r.get("status") in outcome.counts else "error"
                outcome.counts[status] += 1
                if status != "scheduled":
                    outcome.errors.append(f"line {line.number}: {status}: "
                                          f"{r.get('error') or r.get('id')}")
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return outcome


def _locate(e: InvalidTask, chunk: list[Line]) -> str:
    """``tasks[3].url must be ...`` -> ``line 17: url must be ...``."""
    m = _TASK_INDEX.fullmatch(e.field or "")
    if m and int(m.group(1)) < len(chunk):
        rest = e.message.removeprefix(e.field or "").strip()
        where = m.group(2).lstrip(".") or "task"
        return f"line {chunk[int(m.group(1))].number}: {where} {rest}"
    return e.message


def _bar(total: int) -> Any:
    return tqdm(total=total, unit="task", file=sys.stderr, dynamic_ncols=True)
