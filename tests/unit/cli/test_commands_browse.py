"""The client commands' handlers (``miyamoto.cli.commands``) against a recording
client: what they ask and what they print. Against a real node: tests/nodes/test_cli.py."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from miyamoto.cli import commands

pytestmark = pytest.mark.timeout(30)


class Client:
    def __init__(self, page: dict[str, Any]) -> None:
        self.page = page
        self.asked: list[tuple] = []

    def browse(self, state: str, **kw: Any) -> dict[str, Any]:
        self.asked.append((state, kw))
        return self.page


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands.add_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def test_browse_prints_a_page_and_where_the_next_begins(capsys) -> None:
    page = {"tasks": [{"id": "t-1", "state": "failed", "attempts": 3, "name": "inv-1",
                       "url": "http://w/x", "finished": 1.7e9}], "next_cursor": "1.7e9~t-1"}
    client = Client(page)
    args = parsed("browse", "--state", "failed", "--queue", "mail", "--name-prefix", "inv-",
                  "--limit", "10", "--label", "team=a", "--since", "1700000000")
    assert commands._browse(client, args) == 0
    assert client.asked == [("failed", {"queue": "mail", "target": None, "name_prefix": "inv-",
                                        "label": "team=a", "since": 1.7e9, "until": None,
                                        "cursor": None, "limit": 10})]
    out = capsys.readouterr()
    assert "t-1" in out.out and "inv-1" in out.out
    assert out.err.strip() == "next page: --cursor 1.7e9~t-1"
    commands._browse(Client(dict(page, next_cursor=None)), parsed("browse", "--json"))
    out = capsys.readouterr()
    assert json.loads(out.out)["tasks"][0]["id"] == "t-1" and out.err == ""
    commands._browse(Client({"tasks": [], "next_cursor": None}), parsed("browse"))
    assert capsys.readouterr().err.strip() == "(the last page)"


class FailedClient:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def queue(self, name: str) -> dict[str, Any]:
        return {"counts": {"failed": 3}}

    def delete_failed(self, name: str) -> dict[str, Any]:
        self.deleted.append(name)
        return {"deleted": 3, "more": False}


class Terminal:
    def __init__(self, answer: str, tty: bool = True) -> None:
        self.answer, self.tty = answer, tty

    def isatty(self) -> bool:
        return self.tty

    def readline(self) -> str:
        return self.answer


@pytest.mark.parametrize("answer, deleted", [
    ("\n", False), ("", False), ("n\n", False), ("yep\n", False),
    ("y\n", True), (" YES \n", True)])
def test_failed_delete_asks_and_only_a_yes_deletes(monkeypatch, capsys, answer: str,
                                                   deleted: bool) -> None:
    """A bare Enter at the [y/N] prompt is the N."""
    monkeypatch.setattr("sys.stdin", Terminal(answer))
    client = FailedClient()
    code = commands._failed_bulk(client, parsed("failed", "delete", "mail"))
    out = capsys.readouterr()
    assert "Delete the 3 failed task(s) of queue 'mail' on every node? [y/N]" in out.err
    assert (code, client.deleted) == ((0, ["mail"]) if deleted else (1, []))
    assert ("not deleted" in out.err) is not deleted


def test_failed_delete_without_a_terminal_wants_yes(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin", Terminal("y\n", tty=False))
    client = FailedClient()
    with pytest.raises(commands.UsageError, match="without --yes"):
        commands._failed_bulk(client, parsed("failed", "delete", "mail"))
    assert client.deleted == []
    assert commands._failed_bulk(client, parsed("failed", "delete", "mail",
                                                "--yes")) == 0
    assert client.deleted == ["mail"] and "[y/N]" not in capsys.readouterr().err
