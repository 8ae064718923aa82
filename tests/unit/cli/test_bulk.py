"""``miyamoto enqueue --file`` (``miyamoto.cli.bulk`` and its handler) against a recording
client: which batches go where, what is counted and what is said. Against a real node:
tests/nodes/test_cli.py."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from miyamoto.cli import bulk, commands
from miyamoto.cli.commands import UsageError
from miyamoto.client import InvalidTask

pytestmark = pytest.mark.timeout(30)


class Client:
    """Answers each batch with one result per task (``answers`` may name a status per
    task url), or raises ``refuse`` for the batch holding it."""

    def __init__(self, answers: dict[str, dict[str, Any]] | None = None,
                 refuse: InvalidTask | None = None) -> None:
        self.answers = answers or {}
        self.refuse = refuse
        self.batches: list[tuple[str, list[dict[str, Any]]]] = []

    def enqueue_batch(self, tasks: list[dict[str, Any]], queue: str = "default") -> list:
        self.batches.append((queue, [dict(t) for t in tasks]))
        if self.refuse is not None:
            raise self.refuse
        return [self.answers.get(t["url"], {"status": "scheduled", "id": t["url"]})
                for t in tasks]


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands.add_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def jsonl(tmp_path: Path, *lines: Any) -> str:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n"
                            for ln in lines))
    return str(path)


def test_queue_flag_is_only_a_default_a_lines_own_queue_wins(tmp_path: Path, capsys) -> None:
    f = jsonl(tmp_path, {"url": "http://w/1"}, {"url": "http://w/2", "queue": "mail"}, "",
              {"url": "http://w/3", "queue": None}, {"url": "http://w/4", "priority": 1})
    client = Client()
    args = parsed("enqueue", "--file", f, "--queue", "bulk", "--priority", "5")
    assert commands._enqueue(client, args) == 0
    sent = {queue: [t["url"] for t in tasks] for queue, tasks in client.batches}
    assert sent == {"bulk": ["http://w/1", "http://w/3", "http://w/4"], "mail": ["http://w/2"]}
    # every other flag is a default too: a line's own value wins
    priorities = {t["url"]: t["priority"] for _, tasks in client.batches for t in tasks}
    assert priorities == {"http://w/1": 5, "http://w/2": 5, "http://w/3": 5, "http://w/4": 1}
    assert json.loads(capsys.readouterr().out) == {"tasks": 4, "scheduled": 4, "duplicate": 0,
                                                   "error": 0}


def test_without_queue_a_line_without_one_goes_to_default() -> None:
    lines = bulk.read_lines(io.StringIO('{"url": "u1"}\n{"url": "u2", "queue": "q"}\n'), None)
    assert [(ln.number, ln.task.get("queue")) for ln in lines] == [(1, None), (2, "q")]
    assert [(q, [ln.number for ln in c]) for q, c in bulk.chunks(lines, 10)] == \
        [("default", [1]), ("q", [2])]


@pytest.mark.parametrize("text, why", [
    ("", "holds no tasks"), ("\n  \n", "holds no tasks"),
    ('{"url": "u"}\n{"url": \n', "line 2: not JSON"),
    ('{"url": "u"}\n\n[1, 2]\n', "line 3: not a JSON object"),
])
def test_a_bad_file_is_refused_whole_naming_the_line(tmp_path: Path, text: str,
                                                      why: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    client = Client()
    with pytest.raises(UsageError, match=f"--file {path}: {why}"):
        commands._enqueue(client, parsed("enqueue", "--file", str(path)))
    assert client.batches == []  # nothing is sent


def test_chunks_keep_file_order_within_the_count_and_the_byte_bound(monkeypatch) -> None:
    lines = [bulk.Line(n, {"url": f"u{n}", "queue": "a" if n % 2 else "b"})
             for n in range(1, 8)]
    got = [(q, [ln.number for ln in c]) for q, c in bulk.chunks(lines, 2)]
    assert got == [("a", [1, 3]), ("a", [5, 7]), ("b", [2, 4]), ("b", [6])]
    # each task is 25 bytes of JSON (+2 counted): a bound of 54 takes two, 53 only one
    big = [bulk.Line(n, {"url": "x" * 14}) for n in range(3)]
    assert len(json.dumps(big[0].task)) == 25
    monkeypatch.setattr(bulk, "MAX_CHUNK_BYTES", 54)
    assert [len(c) for _, c in bulk.chunks(big, 10)] == [2, 1]
    monkeypatch.setattr(bulk, "MAX_CHUNK_BYTES", 53)
    assert [len(c) for _, c in bulk.chunks(big, 10)] == [1, 1, 1]


def test_duplicates_and_errors_are_counted_named_by_line_and_exit_1(tmp_path: Path,
                                                                    capsys) -> None:
    f = jsonl(tmp_path, {"url": "u1"}, {"url": "u2"}, {"url": "u3"}, {"url": "u4"})
    client = Client({"u2": {"status": "duplicate", "id": "t-9"},
                     "u4": {"status": "error", "error": "url must be http(s)"},
                     "u3": {"status": "odd"}})
    assert commands._enqueue(client, parsed("enqueue", "--file", f, "--batch-size", "3")) == 1
    assert [len(tasks) for _, tasks in client.batches] == [3, 1]
    out = capsys.readouterr()
    assert json.loads(out.out) == {"tasks": 4, "scheduled": 1, "duplicate": 1, "error": 2}
    assert out.err.splitlines() == ["miyamoto: line 2: duplicate: t-9",
                                    "miyamoto: line 3: error: None",
                                    "miyamoto: line 4: error: url must be http(s)"]


def test_all_scheduled_is_ok_and_exit_0() -> None:
    lines = [bulk.Line(1, {"url": "u1"}), bulk.Line(2, {"url": "u2"})]
    outcome = bulk.run(Client(), lines, 1, progress=False)
    assert outcome.ok and outcome.counts == {"scheduled": 2, "duplicate": 0, "error": 0}
    assert not bulk.Outcome({"scheduled": 1, "duplicate": 1, "error": 0}).ok
    assert not bulk.Outcome({"scheduled": 1, "duplicate": 0, "error": 1}).ok


def test_a_refused_batch_names_the_line_of_the_file(tmp_path: Path) -> None:
    lines = [bulk.Line(n, {"url": f"u{n}"}) for n in (4, 9, 17)]
    refused = InvalidTask("tasks[2].url must be http(s)", 400, {"field": "tasks[2].url"})
    with pytest.raises(InvalidTask) as e:
        bulk.run(Client(refuse=refused), lines, 10, progress=False)
    assert e.value.message == "line 17: url must be http(s)" and str(e.value) == e.value.message
    whole = InvalidTask("tasks[0] must be an object", 400, {"field": "tasks[0]"})
    with pytest.raises(InvalidTask, match="^line 4: task must be an object$"):
        bulk.run(Client(refuse=whole), lines, 10, progress=False)
    # an index past the chunk, or no field: the node's words as they are
    for field in ("tasks[3].url", None):
        other = InvalidTask("tasks[3].url is bad", 400, {"field": field})
        with pytest.raises(InvalidTask, match=r"^tasks\[3\]\.url is bad$"):
            bulk.run(Client(refuse=other), lines, 10, progress=False)


def test_a_bad_batch_size_or_mixed_arguments_are_usage_errors(tmp_path: Path) -> None:
    f = jsonl(tmp_path, {"url": "u1"})
    for argv, why in ((("--batch-size", "0"), "between 1 and 1000"),
                      (("--batch-size", "1001"), "between 1 and 1000"),
                      (("--name", "n"), "--name names one task")):
        with pytest.raises(UsageError, match=why):
            commands._enqueue(Client(), parsed("enqueue", "--file", f, *argv))
    assert commands._enqueue(Client(), parsed("enqueue", "--file", f, "--batch-size",
                                              "1000")) == 0


def test_the_default_batch_is_200_tasks(tmp_path: Path, capsys) -> None:
    f = jsonl(tmp_path, *({"url": f"u{n}"} for n in range(201)))
    client = Client()
    assert commands._enqueue(client, parsed("enqueue", "--file", f)) == 0
    assert [len(tasks) for _, tasks in client.batches] == [200, 1]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_drawn_and_finished_only_on_a_terminal(monkeypatch) -> None:
    lines = [bulk.Line(n, {"url": f"u{n}"}) for n in range(3)]
    err = Tty()
    monkeypatch.setattr("sys.stderr", err)
    bulk.run(Client(), lines, 2)
    drawn = err.getvalue()
    assert "3/3" in drawn and drawn.endswith("\n")  # closed: the last state, then a newline
    for stream, progress in ((Tty(), False), (io.StringIO(), None)):
        monkeypatch.setattr("sys.stderr", stream)
        bulk.run(Client(), lines, 2, progress=progress)
        assert stream.getvalue() == ""
