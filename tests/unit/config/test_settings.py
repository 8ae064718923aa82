"""miyamoto.config.settings: defaults, then INI, environment and flags in that order of
precedence, node sections, errors that name the option, and secrets kept out of the text."""

from __future__ import annotations

import base64
import dataclasses
import os
import socket

import pytest

from miyamoto.config import settings as config_mod
from miyamoto.config.settings import ConfigError, QueueConfig

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def test_config_signing_secrets_comma_or_space_separated():
    other = "whsec_" + base64.b64encode(b"z" * 64).decode()
    for raw in (f"{SECRET},{other}", f" {SECRET}  {other} ", f"{SECRET}, {other},"):
        c = config_mod.load(env={"MIYAMOTO_SIGNING_SECRET": raw})
        assert c.signing_secret == (SECRET, other)
    assert config_mod.load(env={}).signing_secret == ()


def test_config_bad_signing_secret_is_not_quoted():
    bad = "whsec_dHdlbnR5LWJ5dGVzLXNlY3JldCE="  # base64, but 20 bytes
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={"MIYAMOTO_SIGNING_SECRET": f"{SECRET} {bad}"})
    assert str(info.value).startswith("signing_secret: entry 2")
    assert bad[6:] not in str(info.value) and SECRET[6:] not in str(info.value)


def load(ini: str | None = None, env: dict | None = None, flags: dict | None = None, tmp=None):
    path = None
    if ini is not None:
        path = os.path.join(tmp, "m.ini")
        with open(path, "w") as f:
            f.write(ini)
    return config_mod.load(path, env=env or {}, flags=flags)


def test_config_defaults():
    c = config_mod.load(env={})
    assert c.http == "127.0.0.1:8088"
    assert c.cluster == "tcp://127.0.0.1:6000"
    assert c.advertise == c.cluster
    assert c.data_dir == "./miyamoto-data"
    assert c.replication == 2 and c.min_replicas == 1
    assert c.replica_offset == 5.0
    assert c.heartbeat_interval == 0.5 and c.failure_timeout == 3.0
    assert (c.max_body, c.max_url, c.max_delay, c.max_name) == (1 << 20, 2083, 30 * 86400, 500)
    assert c.dedup_window == 3600
    assert c.node.endswith("-8088")
    assert c.seeds == ()
    d = c.queue("default")
    assert d == QueueConfig(name="default")
    assert (d.timeout, d.rate, d.max_attempts) == (30.0, 0.0, 25)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.http = "x"  # type: ignore[misc]


def test_config_ini(tmp_path):
    c = load("""
[miyamoto]
http = 0.0.0.0:9000
insecure_http = true
replication = 3
seeds = tcp://10.0.0.1:6000, tcp://10.0.0.2:6000
insecure_cluster = true
log_level = debug

[queue:default]
min_backoff = 0.05
max_backoff = 0.5

[queue:emails]
rate = 5
burst = 1
max_concurrent = 2
paused = yes
""", tmp=tmp_path)
    assert c.http == "0.0.0.0:9000" and c.http_port == 9000 and c.http_host == "0.0.0.0"
    assert c.replication == 3
    assert c.seeds == ("tcp://10.0.0.1:6000", "tcp://10.0.0.2:6000")
    assert c.log_level == "DEBUG"
    d = c.queue("default")
    assert (d.min_backoff, d.max_backoff) == (0.05, 0.5)
    e = c.queue("emails")
    assert (e.name, e.rate, e.burst, e.max_concurrent, e.paused) == ("emails", 5.0, 1, 2, True)
    assert (e.min_backoff, e.max_backoff) == (0.05, 0.5)  # inherited from [queue:default]
    new = c.queue("brand-new")  # created on first use with [queue:default]'s values
    assert new.name == "brand-new" and new.min_backoff == 0.05 and new.rate == 0


def test_config_precedence(tmp_path):
    ini = "[miyamoto]\nreplica_offset = 1\nhttp = 127.0.0.1:1111\nreplication = 3\n"
    c = load(ini, tmp=tmp_path)
    assert (c.replica_offset, c.http, c.replication) == (1.0, "127.0.0.1:1111", 3)
    c = load(ini, env={"MIYAMOTO_REPLICA_OFFSET": "2", "MIYAMOTO_HTTP": "127.0.0.1:2222"},
             tmp=tmp_path)
    assert (c.replica_offset, c.http, c.replication) == (2.0, "127.0.0.1:2222", 3)
    c = load(ini, env={"MIYAMOTO_REPLICA_OFFSET": "2", "MIYAMOTO_HTTP": "127.0.0.1:2222"},
             flags={"http": "127.0.0.1:3333", "replica_offset": None}, tmp=tmp_path)
    assert (c.replica_offset, c.http) == (2.0, "127.0.0.1:3333")  # None flags are unset


def test_config_file_from_env_and_flag(tmp_path):
    a = tmp_path / "a.ini"
    a.write_text("[miyamoto]\nreplication = 4\n")
    b = tmp_path / "b.ini"
    b.write_text("[miyamoto]\nreplication = 5\n")
    assert config_mod.load(env={"MIYAMOTO_CONFIG": str(a)}).replication == 4
    assert config_mod.load(env={"MIYAMOTO_CONFIG": str(a)},
                           flags={"config": str(b)}).replication == 5


def test_config_node_sections(tmp_path):
    ini = """
[miyamoto]
replication = 2
[node:a]
http = 127.0.0.1:8001
cluster = tcp://127.0.0.1:6001
[node:b]
http = 127.0.0.1:8002
cluster = tcp://127.0.0.1:6002
seeds = tcp://127.0.0.1:6001
insecure_cluster = true
"""
    c = load(ini, flags={"node": "b"}, tmp=tmp_path)
    assert (c.node, c.http, c.cluster, c.seeds) == ("b", "127.0.0.1:8002", "tcp://127.0.0.1:6002",
                                                   ("tcp://127.0.0.1:6001",))
    with pytest.raises(ConfigError, match="node"):
        load(ini, flags={"node": "zz"}, tmp=tmp_path)


@pytest.mark.parametrize("source,name,value", [
    ("env", "replication", "0"), ("flag", "replication", "0"), ("ini", "replication", "two"),
    ("env", "http", "nonsense"), ("flag", "http", "host:99999"), ("ini", "http", ":80"),
    ("env", "cluster", "udp://1.2.3.4:5"), ("env", "seeds", "tcp://a:1,b:2"),
    ("env", "replica_offset", "-1"), ("env", "replica_offset", "nan"),
    ("env", "heartbeat_interval", "inf"), ("env", "log_level", "loud"),
    ("env", "signing_secret", "plain"), ("ini", "signing_secret", "whsec_NOT-base64!!"),
    ("env", "signing_secret", "whsec_"), ("env", "signing_secret", "whsec_" + "QUFB" * 2),
    ("flag", "signing_secret", SECRET + ",dGVzdA=="), ("env", "curve_public", "short"),
    ("env", "max_body", "0"), ("env", "concurrency", "1.5"), ("env", "advertise", "x"),
    ("env", "auto_create_queues", "maybe"), ("flag", "auto_create_queues", "2"),
    ("ini", "auto_create_queues", "sometimes"), ("env", "max_queues", "0"),
    ("flag", "max_queues", "many"), ("ini", "max_queues", "1.5"),
    ("env", "queue_idle_expiry", "-1"), ("flag", "queue_idle_expiry", "nan"),
    ("ini", "queue_idle_expiry", "an hour"),
])
def test_config_bad_values_name_the_option(tmp_path, source, name, value):
    kw: dict = {}
    if source == "env":
        kw["env"] = {f"MIYAMOTO_{name.upper()}": value}
    elif source == "flag":
        kw["flags"] = {name: value}
    else:
        kw["ini"] = f"[miyamoto]\n{name} = {value}\n"
    with pytest.raises(ConfigError) as info:
        load(tmp=tmp_path, **kw)
    assert str(info.value).startswith(name), str(info.value)


@pytest.mark.parametrize("ini,culprit", [
    ("[miyamoto]\ncolour = red\n", "colour"),
    ("[queue:q]\nrate = fast\n", "queue:q.rate"),
    ("[queue:q]\nspeed = 1\n", "queue:q.speed"),
    ("[queue:default]\nmin_backoff = 2\nmax_backoff = 1\n", "queue:default.max_backoff"),
    ("[queue:q]\nmax_attempts = 0\n", "queue:q.max_attempts"),
    ("[queue:q]\npaused = maybe\n", "queue:q.paused"),
    ("[queue:bad.name]\nrate = 1\n", "queue:bad.name"),
    ("[cluster]\nx = 1\n", "cluster"),
    ("[miyamoto]\nelection_timeout_min = 3\nelection_timeout_max = 1\n", "election_timeout_max"),
    ("[miyamoto]\nmax_queues = 2\n[queue:a]\n[queue:b]\n", "max_queues"),
    ("[miyamoto]\ncurve_public = " + "a" * 40 + "\n", "curve_secret"),
    ("this is not an ini file", "config"),
])
def test_config_bad_ini(tmp_path, ini, culprit):
    with pytest.raises(ConfigError) as info:
        load(ini, tmp=tmp_path)
    assert culprit in str(info.value)


def test_config_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        config_mod.load(str(tmp_path / "nope.ini"), env={})


def test_config_redacts_secrets():
    c = config_mod.load(env={"MIYAMOTO_SIGNING_SECRET": SECRET})
    assert c.signing_secret == (SECRET,)
    red = c.redacted()
    assert red["signing_secret"] == "***" and SECRET not in str(red)
    assert red["curve_secret"] == ""


def test_config_every_setting_has_an_env_twin():
    for s in config_mod.SETTINGS:
        if s.name in ("node", "zone", "seeds", "advertise", "curve_public", "curve_secret",
                      "signing_secret", "log_level", "data_dir"):
            continue
        value = str(s.default) if not isinstance(s.default, tuple) else ""
        c = config_mod.load(env={f"MIYAMOTO_{s.name.upper()}": value})
        assert getattr(c, s.name) == s.default, s.name


@pytest.mark.parametrize("source,where", [
    ("flag", "(from --replication)"), ("env", "(from MIYAMOTO_REPLICATION)"),
    ("ini", "(from config file")])
def test_a_bad_number_names_the_option_the_form_and_where_it_came_from(tmp_path, source, where):
    kw: dict = {"flags": {"replication": "two"}} if source == "flag" else \
        {"env": {"MIYAMOTO_REPLICATION": "two"}} if source == "env" else \
        {"ini": "[miyamoto]\nreplication = two\n"}
    with pytest.raises(ConfigError) as info:
        load(tmp=tmp_path, **kw)
    text = str(info.value)
    assert text.startswith("replication: must be a whole number >= 1, not 'two'"), text
    assert where in text and "invalid literal" not in text, text


@pytest.mark.parametrize("name,value,words", [
    ("replica_offset", "soon", "must be a number >= 0, not 'soon'"),
    ("heartbeat_interval", "nan", "must be a number >= 0.01, not 'nan'"),
    ("concurrency", "1.5", "must be a whole number >= 1, not '1.5'"),
    ("max_body", "0", "must be a whole number >= 1, not 0"),
    ("access_log", "maybe", "must be true or false"),
    ("http", "nonsense", "must be HOST:PORT, e.g. 127.0.0.1:8088, not 'nonsense'"),
    ("cluster", "tcp://x", "must be tcp://HOST:PORT"),
])
def test_bad_values_say_the_expected_form(name, value, words):
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={f"MIYAMOTO_{name.upper()}": value})
    assert str(info.value).startswith(f"{name}: {words}"), str(info.value)


@pytest.mark.parametrize("variable,closest", [
    ("MIYAMOTO_REPLICATON", "MIYAMOTO_REPLICATION"), ("MIYAMOTO_ACCESSLOG", "MIYAMOTO_ACCESS_LOG"),
    ("MIYAMOTO_SERVR", "MIYAMOTO_SERVER"), ("MIYAMOTO_CURVE_SECRETS", "MIYAMOTO_CURVE_SECRET"),
])
def test_an_unknown_variable_is_an_error_naming_the_closest(variable, closest):
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={variable: "3"})
    assert str(info.value).startswith(f"{variable}: no such option; did you mean {closest}?")


def test_an_unknown_variable_far_from_any_says_where_the_options_are():
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={"MIYAMOTO_ZZZZZZZZZZZZZZZZ": "1"})
    assert "did you mean" not in str(info.value) and "--help" in str(info.value)


def test_the_variables_that_are_not_options_are_known():
    env = {name: "x" for name in config_mod.OTHER_VARIABLES if name != "MIYAMOTO_CONFIG"}
    config_mod.load(env={**env, "OTHER_THING": "1", "MIYAMOTOFOO": "1"})


def test_an_unknown_ini_key_names_the_closest(tmp_path):
    with pytest.raises(ConfigError) as info:
        load("[miyamoto]\nreplicaton = 2\n", tmp=tmp_path)
    assert str(info.value).startswith("replicaton: unknown option in ")
    assert str(info.value).endswith("did you mean replication?")


def test_an_error_never_quotes_a_secret_of_a_flag_it_came_from():
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={}, flags={"signing_secret": "plainsecretvalue"})
    assert "plainsecretvalue" not in str(info.value) and "(from --signing-secret)" in str(info.value)


def test_the_default_node_id_is_unique_per_host_and_http_address():
    host = socket.gethostname()
    ids = {config_mod.load(env={}, flags={"http": f"127.0.0.{i}:8088"}).node for i in (2, 3, 4)}
    assert ids == {f"{host}-127.0.0.{i}-8088" for i in (2, 3, 4)}
    assert config_mod.load(env={}, flags={"http": "127.0.0.1:8089"}).node == f"{host}-8089"
    assert config_mod.default_node_id("h", "0.0.0.0:80") == "h-80"
    assert config_mod.default_node_id("h", "[::1]:8088") == "h-..1-8088"
    assert config_mod.load(env={}, flags={"http": "127.0.0.2:8088", "node": "a"}).node == "a"


def test_the_queue_bounds_default_and_read_every_source(tmp_path):
    c = load(tmp=tmp_path)
    assert (c.auto_create_queues, c.max_queues, c.queue_idle_expiry) == (True, 1000, 3600.0)
    c = load(tmp=tmp_path, env={"MIYAMOTO_AUTO_CREATE_QUEUES": "off",
                                "MIYAMOTO_QUEUE_IDLE_EXPIRY": "0"}, flags={"max_queues": "5"})
    assert (c.auto_create_queues, c.max_queues, c.queue_idle_expiry) == (False, 5, 0.0)
    c = load(tmp=tmp_path, ini="[miyamoto]\nmax_queues = 2\n[queue:a]\n")  # a + default
    assert c.max_queues == 2 and set(c.queues) == {"a", "default"}
