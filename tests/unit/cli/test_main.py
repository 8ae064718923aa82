"""The `miyamoto` command's parser: `serve`'s flags (bare booleans, the grouped help that
lists every option) and the check of MIYAMOTO_* variables before any command runs. In
process, no node: main() is called with an argv, as the console script calls it."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

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


# ------------------------------------------------------------------ serve, in process
class FakeNode:
    """Stands in for miyamoto.node.Node: records what serve does with it."""

    made: list["FakeNode"] = []
    fail: BaseException | None = None

    def __init__(self, config):
        self.config = config
        self.calls: list[str] = []
        FakeNode.made.append(self)

    def start(self):
        self.calls.append("start")
        if FakeNode.fail is not None:
            raise FakeNode.fail

    def serve_forever(self):
        self.calls.append("serve_forever")

    def stop(self):
        self.calls.append("stop")

    def reload_tls(self):
        self.calls.append("reload_tls")


@pytest.fixture
def served(monkeypatch):
    """serve without gevent's patching, logging setup, signal handlers or a real node."""
    import gevent
    from gevent import monkey

    import miyamoto.cli.processes as processes
    import miyamoto.logs as logs
    import miyamoto.node as node_mod

    seen: dict = {"patched": 0, "logs": [], "handlers": {}, "spawned": [], "supervised": []}
    monkeypatch.setattr(monkey, "patch_all", lambda: seen.__setitem__("patched",
                                                                      seen["patched"] + 1))
    monkeypatch.setattr(logs, "configure", lambda *a: seen["logs"].append(a))
    monkeypatch.setattr(node_mod, "Node", FakeNode)
    monkeypatch.setattr(gevent, "signal_handler",
                        lambda signum, fn: seen["handlers"].__setitem__(signum, fn))
    monkeypatch.setattr(gevent, "spawn", lambda fn, *a: seen["spawned"].append(fn))
    # the collector's tuning is the test process's own otherwise (a freeze for the session)
    monkeypatch.setattr(cli, "_tune_collector",
                        lambda: seen.__setitem__("tuned", [n.calls[:] for n in FakeNode.made]))

    def supervise(config, flags):
        seen["supervised"].append((config, dict(flags)))
        if isinstance(seen.get("supervise_raises"), Exception):
            raise seen["supervise_raises"]
        return 7

    monkeypatch.setattr(processes, "supervise", supervise)
    for name in [n for n in os.environ if n.startswith("MIYAMOTO_")]:
        monkeypatch.delenv(name)
    FakeNode.made, FakeNode.fail = [], None
    return seen


def test_serve_patches_gevent_then_runs_a_node_with_the_flags_until_a_signal(served):
    import signal

    assert cli.main(["serve", "--http", "127.0.0.1:1234", "--access-log",
                     "--log-format", "json"]) == 0
    (node,) = FakeNode.made
    assert served["patched"] == 1 and served["logs"] == [("INFO", "json")]
    assert node.config.http == "127.0.0.1:1234" and node.config.access_log is True
    assert node.calls == ["start", "serve_forever"]
    assert served["tuned"] == [["start"]]  # the collector is tuned once the node is up
    assert set(served["handlers"]) == {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    served["handlers"][signal.SIGTERM]()
    assert served["spawned"] == [node.stop]  # a signal stops the node, off the handler
    served["handlers"][signal.SIGHUP]()
    assert served["spawned"] == [node.stop, node.reload_tls]  # SIGHUP: the certificate again
    assert served["supervised"] == []


def test_no_command_means_serve(served, monkeypatch):
    assert cli.main([]) == 0
    monkeypatch.setattr(cli.sys, "argv", ["miyamoto"])
    assert cli.main() == 0  # as the console script calls it
    assert [n.calls for n in FakeNode.made] == [["start", "serve_forever"]] * 2
    assert FakeNode.made[0].config.http == "127.0.0.1:8088"


def test_serve_with_a_bad_option_exits_2_naming_it(served, capsys):
    assert cli.main(["serve", "--replication", "0"]) == 2
    assert capsys.readouterr().err.startswith("miyamoto: bad option replication: ")
    assert FakeNode.made == []


def test_serve_reads_the_config_file_flag(served, tmp_path):
    ini = tmp_path / "m.ini"
    ini.write_text("[miyamoto]\nreplication = 3\n")
    assert cli.main(["serve", "--config", str(ini)]) == 0
    assert FakeNode.made[0].config.replication == 3


def test_serve_with_processes_hands_the_flags_to_the_supervisor(served, capsys):
    assert cli.main(["serve", "--processes", "2", "--http", "127.0.0.1:1234"]) == 7
    ((config, flags),) = served["supervised"]
    assert config.processes == 2 and flags == {"processes": "2", "http": "127.0.0.1:1234"}
    assert FakeNode.made == []
    served["supervise_raises"] = cli.ConfigError("cluster: too many")
    assert cli.main(["serve", "--processes", "2"]) == 2
    assert "miyamoto: bad option cluster: too many" in capsys.readouterr().err


def test_a_locked_data_dir_exits_2_and_another_os_error_1(served, capsys, caplog):
    from miyamoto.store.datadir import DataDirLocked

    FakeNode.fail = DataDirLocked("/d", 42)
    assert cli.main(["serve"]) == 2
    assert capsys.readouterr().err == \
        "miyamoto: cannot start: data dir /d is in use by another node (pid 42)\n"
    FakeNode.fail = OSError(98, "Address already in use")
    with caplog.at_level("ERROR", logger="miyamoto"):
        assert cli.main(["serve"]) == 1
    assert "cannot start: [Errno 98] Address already in use" in caplog.text
    assert all(n.calls == ["start"] for n in FakeNode.made)  # never served


# ------------------------------------------------------------------ main's exits
def test_a_commands_code_is_mains_and_ctrl_c_is_130(monkeypatch):
    monkeypatch.setattr(cli, "_keygen", lambda args: 5)
    assert cli.main(["keygen"]) == 5

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_keygen", interrupted)
    assert cli.main(["keygen"]) == 130


class _GonePipe:
    """A stdout whose reader left: flushing it fails, as a closed pipe does."""

    def __init__(self, f):
        self.f = f

    def write(self, s):
        return self.f.write(s)

    def fileno(self):
        return self.f.fileno()

    def flush(self):
        raise BrokenPipeError


def test_a_reader_that_went_away_is_141_and_stdout_goes_nowhere_after(monkeypatch, tmp_path):
    out = open(tmp_path / "out", "w")
    monkeypatch.setattr(cli.sys, "stdout", _GonePipe(out))
    monkeypatch.setattr(cli, "_keygen", lambda args: 0)
    fds = len(os.listdir("/proc/self/fd"))
    assert cli.main(["keygen"]) == 141
    assert len(os.listdir("/proc/self/fd")) == fds  # the /dev/null it opened is closed
    os.write(out.fileno(), b"after")  # the fd now points at /dev/null
    out.close()
    assert (tmp_path / "out").read_text() == ""


def test_keygen_prints_a_config_section_with_a_fresh_pair(capsys):
    assert cli.main(["keygen"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("; the cluster key pair") and lines[1] == "[miyamoto]"
    keys = dict(line.split(" = ") for line in lines[2:])
    assert sorted(keys) == ["curve_public", "curve_secret"]
    assert all(len(k) == 40 for k in keys.values())


def test_keygen_cannot_create_in_a_missing_dir_and_says_why(tmp_path, capsys):
    path = tmp_path / "no" / "such.env"
    assert cli.main(["keygen", "--env-file", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"cannot create {path}: No such file or directory" in err
    assert "remove it first" not in err and not path.exists()


def test_version(capsys):
    from miyamoto.version import __version__

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == f"miyamoto {__version__}\n"


PATCH_PROBE = """
from importlib import metadata
read, reads = metadata.entry_points, []
def counting(**params):
    reads.append(params)
    return read(**params)
metadata.entry_points = counting
from miyamoto.cli.main import _patch_all
_patch_all()
from gevent import monkey
print(len(reads), metadata.entry_points is counting, monkey.is_module_patched("socket"),
      list(metadata.entry_points(group="console_scripts")) == list(read(group="console_scripts")))
"""


@pytest.mark.timeout(60)
def test_serve_patches_with_one_read_of_the_entry_points_and_puts_the_reader_back():
    # gevent's patch_all looks its plugin hooks up once per module it patches; each
    # lookup reads every installed distribution's metadata (a quarter of a start-up)
    out = subprocess.run([sys.executable, "-c", PATCH_PROBE], capture_output=True,
                         text=True, timeout=50, check=True).stdout.split()
    assert out == ["1", "True", "True", "True"]


COLLECTOR_PROBE = """
import gc, weakref
from miyamoto.cli.main import COLLECT_EVERY, _tune_collector
class Cycle:
    pass
c = Cycle()
c.me = c  # garbage only the collector frees: not frozen with what lives
gone = weakref.ref(c)
del c
_tune_collector()
print(gc.get_threshold() == COLLECT_EVERY, gc.get_freeze_count() > 1000, gone() is None)
"""


@pytest.mark.timeout(60)
def test_a_started_node_freezes_what_start_up_made_and_collects_young_objects_less_often():
    out = subprocess.run([sys.executable, "-c", COLLECTOR_PROBE], capture_output=True,
                         text=True, timeout=50, check=True).stdout.split()
    assert out == ["True", "True", "True"]
