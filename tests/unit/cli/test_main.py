"""The `miyamoto` command's parser: `serve`'s flags (bare booleans, the grouped help that
lists every option) and the check of MIYAMOTO_* variables before any command runs. In
process, no node: main() is called with an argv, as the console script calls it."""

from __future__ import annotations

import re

import pytest

from miyamoto.cli import main as cli
from miyamoto.config.settings import GROUPS, SETTINGS, load


def serve_flags(*argv: str) -> dict:
    args = cli._parser().parse_args(["serve", *argv])
    return {s.name: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name, None)}


@pytest.mark.parametrize("argv,expected", [
    (["--access-log"], True),
    (["--access-log", "--log-level", "debug"], True),
    (["--access-log", "false"], False),
    (["--access-log", "yes"], True),
    ([], False),
])
def test_booleans_work_as_bare_flags(argv, expected):
    config = load(env={}, flags=serve_flags(*argv))
    assert config.access_log is expected


def test_every_boolean_takes_a_bare_flag():
    bools = [s for s in SETTINGS if s.flag and isinstance(s.default, bool)]
    assert bools
    for s in bools:
        assert serve_flags("--" + s.name.replace("_", "-"))[s.name] == "true", s.name


def serve_help(capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    return capsys.readouterr().out


def test_serve_help_is_grouped_and_lists_every_option(capsys):
    text = serve_help(capsys)
    titles = [text.index(f"\n{title}:\n") for title in GROUPS.values()]
    assert titles == sorted(titles), "the sections in GROUPS' order"
    for s in SETTINGS:
        if s.flag:
            assert "--" + s.name.replace("_", "-") in text, s.name
        else:  # a secret: named with its variable, and said to have no flag
            assert f"{s.name} or MIYAMOTO_{s.name.upper()}" in text, s.name
    assert "no flag, config file or environment only" in text
    for name in ("curve_secret", "api_tokens", "signing_secret"):
        assert f"MIYAMOTO_{name.upper()} (secret)" in text
        assert "--" + name.replace("_", "-") not in text


def test_serve_help_has_no_python_reprs(capsys):
    text = serve_help(capsys)
    assert "()" not in text and "'" not in re.sub(r"\b\w+'s\b", "", text)
    assert "default 2]" in text.replace("\n", " ").replace("  ", " ") or "default 2" in text
    assert "--http HOST:PORT" in text and "--access-log [BOOL]" in text
    assert "default tcp://127.0.0.1:6000" in " ".join(text.split())


def test_an_unknown_variable_stops_any_command_with_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("MIYAMOTO_SERVR", "http://127.0.0.1:1")
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert "MIYAMOTO_SERVR" in err and "did you mean MIYAMOTO_SERVER?" in err
