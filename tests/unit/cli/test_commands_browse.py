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
