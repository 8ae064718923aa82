"""The `miyamoto` command's parser: `serve`'s flags (bare booleans, the grouped help that
lists every option) and the check of MIYAMOTO_* variables before any command runs. In
process, no node: main() is called with an argv, as the console script calls it."""

from __future__ import annotations

import os
import re
import stat
import subprocess

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


# what broke an unquoted shell line, a compose file or a systemd unit (the list)
NASTY = "$%<>{&"


@pytest.fixture
def nasty_keys(monkeypatch) -> tuple[bytes, bytes]:
    """keygen's next pair holds every one of NASTY (a real pair: the config checks it)."""
    import zmq

    for _ in range(100_000):
        pair = zmq.curve_keypair()
        if set(NASTY) <= set((pair[0] + pair[1]).decode()):
            monkeypatch.setattr(zmq, "curve_keypair", lambda: pair)
            return pair
    raise AssertionError("no such pair in 100,000")


def test_keygen_env_file_is_0600_and_reads_back_the_same_everywhere(tmp_path, capsys, nasty_keys):
    path = tmp_path / "miyamoto.env"
    assert cli.main(["keygen", "--env-file", str(path)]) == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    keys = dict(line.split("=", 1) for line in path.read_text().splitlines())
    public, secret = (keys[k].strip("'") for k in ("MIYAMOTO_CURVE_PUBLIC", "MIYAMOTO_CURVE_SECRET"))
    assert (public.encode(), secret.encode()) == nasty_keys
    out = capsys.readouterr().out
    assert public in out and secret not in out  # the secret stays in the file
    # a shell: set -a; . FILE
    shell = subprocess.run(["sh", "-c", f'set -a; . "{path}"; printf "%s\\n%s" '
                            '"$MIYAMOTO_CURVE_PUBLIC" "$MIYAMOTO_CURVE_SECRET"'],
                           capture_output=True, text=True, check=True)
    assert shell.stdout.split("\n") == [public, secret]
    # docker run --env-file passes the quotes on; the key's parser drops them
    config = load(env=keys)
    assert (config.curve_public, config.curve_secret) == (public, secret)
    # a dotenv reader (compose's env_file follows the same rule: single quotes are literal)
    dotenv = pytest.importorskip("dotenv")
    assert dict(dotenv.dotenv_values(path)) == {"MIYAMOTO_CURVE_PUBLIC": public,
                                                "MIYAMOTO_CURVE_SECRET": secret}


def test_keygen_never_replaces_a_key_pair(tmp_path, capsys):
    path = tmp_path / "miyamoto.env"
    path.write_text("MIYAMOTO_CURVE_SECRET='the one in use'\n")
    assert cli.main(["keygen", "--env-file", str(path)]) == 1
    assert "remove it first" in capsys.readouterr().err
    assert path.read_text() == "MIYAMOTO_CURVE_SECRET='the one in use'\n"


def test_keygen_section_reads_back_through_the_config_file(tmp_path, capsys, nasty_keys):
    assert cli.main(["keygen"]) == 0
    ini = tmp_path / "keys.ini"
    ini.write_text(capsys.readouterr().out)
    config = load(str(ini), env={})
    assert (config.curve_public.encode(), config.curve_secret.encode()) == nasty_keys
