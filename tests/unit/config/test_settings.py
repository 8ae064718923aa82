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


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))


def test_the_example_config_shows_the_defaults():
    """cluster.example.ini says it shows the defaults: every option it sets (but the demo
    cluster's own seeds and key pair) is the default, and so is [queue:default]."""
    import configparser

    ini = configparser.ConfigParser(interpolation=None)
    ini.read(os.path.join(REPO, "cluster.example.ini"))
    shown = {k: v for k, v in ini.items("miyamoto")
             if k not in ("seeds", "curve_public", "curve_secret")}
    assert len(shown) > 30
    by_name = {s.name: s for s in config_mod.SETTINGS}
    for key, text in shown.items():
        assert by_name[key].parse(text) == by_name[key].default, key
    for key, text in ini.items("queue:default"):
        assert config_mod.QUEUE_FIELDS[key](text) == getattr(QueueConfig(), key), key
    c = config_mod.load(env={})
    assert (c.max_clock_skew, c.processes, c.reuse_port, c.zone != "") == (1.0, 1, False, True)
    assert (c.insecure_cluster, c.insecure_http, c.api_tokens, c.access_log) == \
        (False, False, (), False)
    assert (c.target_allow, c.target_deny, c.curve_public, c.log_format) == ((), (), "", "text")


LOWEST = {  # option -> the lowest value it takes
    "http_header_timeout": 0.1, "http_idle_timeout": 0.1, "max_header_bytes": 1024,
    "max_connections": 16, "max_body": 1, "max_url": 16, "max_delay": 0, "max_name": 1,
    "max_batch": 1, "processes": 1, "replication": 1, "min_replicas": 1,
    "replica_offset": 0, "replication_timeout": 0.01, "heartbeat_interval": 0.01,
    "failure_timeout": 0.05, "election_timeout_min": 0.05, "max_clock_skew": 0.001,
    "claim_lease": 0.1, "concurrency": 1, "max_per_host": 1, "breaker_failures": 0,
    "breaker_cooldown": 0.01, "callback_timeout": 0.1, "shutdown_timeout": 0,
    "memory_window": 1, "retention": 0, "dedup_window": 0,
}
QUEUE_LOWEST = {"rate": 0, "burst": 1, "max_concurrent": 0, "max_attempts": 1,
                "min_backoff": 0, "max_doublings": 0, "max_retry_duration": 0,
                "timeout": 0.01}


def _below(lo):
    return lo - 1 if isinstance(lo, int) else lo * 0.9


@pytest.mark.parametrize("name", sorted(LOWEST))
def test_each_number_takes_its_lowest_value_and_nothing_below(name):
    lo = LOWEST[name]
    assert getattr(config_mod.load(env={_env(name): str(lo)}), name) == lo
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={_env(name): str(_below(lo))})
    assert str(info.value).startswith(f"{name}: must be a "), str(info.value)


def test_the_election_timeouts_may_be_equal_at_their_lowest():
    c = config_mod.load(env={"MIYAMOTO_ELECTION_TIMEOUT_MIN": "0.05",
                             "MIYAMOTO_ELECTION_TIMEOUT_MAX": "0.05"})
    assert c.election_timeout_min == c.election_timeout_max == 0.05
    with pytest.raises(ConfigError, match="^election_timeout_max: must be a number"):
        config_mod.load(env={"MIYAMOTO_ELECTION_TIMEOUT_MAX": "0.04"})


@pytest.mark.parametrize("key", sorted(QUEUE_LOWEST))
def test_each_queue_number_takes_its_lowest_value_and_nothing_below(tmp_path, key):
    lo = QUEUE_LOWEST[key]
    c = load(f"[queue:q]\n{key} = {lo}\n", tmp=tmp_path)
    assert getattr(c.queue("q"), key) == lo
    with pytest.raises(ConfigError, match=f"^queue:q.{key}: must be a "):
        load(f"[queue:q]\n{key} = {_below(lo)}\n", tmp=tmp_path)


def test_max_backoff_may_equal_min_backoff(tmp_path):
    q = load("[queue:q]\nmin_backoff = 2\nmax_backoff = 2\n", tmp=tmp_path).queue("q")
    assert q.min_backoff == q.max_backoff == 2.0
    assert load("[queue:q]\nmax_backoff = 0\nmin_backoff = 0\n", tmp=tmp_path).queue(
        "q").max_backoff == 0


def _env(name: str) -> str:
    return "MIYAMOTO_" + name.upper()


def test_a_node_section_overrides_the_shared_one_and_names_the_node(tmp_path):
    ini = "[miyamoto]\nreplication = 3\nmax_batch = 7\n[node:a]\nreplication = 1\n"
    c = load(ini, flags={"node": "a"}, tmp=tmp_path)
    assert (c.node, c.replication, c.max_batch) == ("a", 1, 7)
    c = load(ini, env={"MIYAMOTO_NODE": "a"}, tmp=tmp_path)  # the node from the environment
    assert (c.node, c.replication) == ("a", 1)
    c = load(ini, tmp=tmp_path)  # no node asked for: node sections are skipped
    assert (c.replication, c.node.endswith("-8088")) == (3, True)
    # a node asked for in a file without node sections: the shared section alone
    c = load("[miyamoto]\nreplication = 3\n", flags={"node": "zz"}, tmp=tmp_path)
    assert (c.node, c.replication) == ("zz", 3)


def test_the_config_file_comes_from_the_flag_then_the_environment_then_the_argument(tmp_path):
    files = {}
    for n in (3, 4, 5):
        files[n] = tmp_path / f"{n}.ini"
        files[n].write_text(f"[miyamoto]\nreplication = {n}\n")
    assert config_mod.load(str(files[3]), env={}).replication == 3
    assert config_mod.load(str(files[3]), env={"MIYAMOTO_CONFIG": str(files[4])}).replication == 4
    assert config_mod.load(str(files[3]), env={"MIYAMOTO_CONFIG": str(files[4])},
                           flags={"config": str(files[5])}).replication == 5


def test_an_unknown_flag_is_named():
    with pytest.raises(ConfigError, match="^colour: unknown option$"):
        config_mod.load(env={}, flags={"colour": "red"})


def test_the_zone_defaults_to_the_host_name_and_advertise_to_the_cluster_endpoint():
    import socket

    c = config_mod.load(env={"MIYAMOTO_CLUSTER": "tcp://127.0.0.1:7000"})
    assert c.zone == socket.gethostname() and c.advertise == "tcp://127.0.0.1:7000"
    assert c.node == f"{socket.gethostname()}-8088"
    c = config_mod.load(env={"MIYAMOTO_ZONE": "rack1", "MIYAMOTO_NODE": "n1",
                             "MIYAMOTO_HTTP": "127.0.0.1:9"})
    assert (c.zone, c.node, c.http_host, c.http_port) == ("rack1", "n1", "127.0.0.1", 9)
    c = config_mod.load(env={"MIYAMOTO_ADVERTISE": " tcp://10.0.0.1:6000 "})
    assert c.advertise == "tcp://10.0.0.1:6000"
    with pytest.raises(ConfigError, match=r"^advertise: must be tcp://HOST:PORT.*\(from "
                                          r"MIYAMOTO_ADVERTISE\)$"):
        config_mod.load(env={"MIYAMOTO_ADVERTISE": "10.0.0.1:6000"})


def test_the_curve_keys_go_together_and_must_be_a_pair():
    import zmq

    public, secret = (k.decode() for k in zmq.curve_keypair())
    c = config_mod.load(env={"MIYAMOTO_CURVE_PUBLIC": public, "MIYAMOTO_CURVE_SECRET": secret})
    assert (c.curve_public, c.curve_secret) == (public, secret)
    with pytest.raises(ConfigError, match="^curve_secret: curve_public and curve_secret go"):
        config_mod.load(env={"MIYAMOTO_CURVE_SECRET": secret})
    with pytest.raises(ConfigError, match="^curve_secret: ") as info:
        config_mod.load(env={"MIYAMOTO_CURVE_PUBLIC": public,
                             "MIYAMOTO_CURVE_SECRET": "~" * 40})  # not Z85
    assert "~" * 40 not in str(info.value)


def test_seeds_other_than_itself_need_the_key_pair_or_insecure_cluster():
    own = {"MIYAMOTO_CLUSTER": "tcp://127.0.0.1:6000", "MIYAMOTO_ADVERTISE": "tcp://10.0.0.9:6000"}
    # itself, by either address, is no other node
    config_mod.load(env={**own, "MIYAMOTO_SEEDS": "tcp://127.0.0.1:6000,tcp://10.0.0.9:6000"})
    other = {**own, "MIYAMOTO_SEEDS": "tcp://127.0.0.1:6000,tcp://127.0.0.1:6001"}
    with pytest.raises(ConfigError, match="^curve_secret: a node with seeds needs the cluster key"):
        config_mod.load(env=other)
    assert config_mod.load(env={**other, "MIYAMOTO_INSECURE_CLUSTER": "true"}).seeds
    import zmq

    public, secret = (k.decode() for k in zmq.curve_keypair())
    assert config_mod.load(env={**other, "MIYAMOTO_CURVE_PUBLIC": public,
                                "MIYAMOTO_CURVE_SECRET": secret}).seeds


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.9.9", "localhost", "LocalHost", "[::1]"])
def test_a_loopback_http_address_needs_no_token(host):
    assert config_mod.load(env={"MIYAMOTO_HTTP": f"{host}:8088"}).http_host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "[::]", "example.com", "localhost.evil"])
def test_an_http_address_beyond_loopback_needs_tokens_or_insecure_http(host):
    env = {"MIYAMOTO_HTTP": f"{host}:8088"}
    with pytest.raises(ConfigError) as info:
        config_mod.load(env=env)
    assert str(info.value).startswith(f"api_tokens: http binds {host}, beyond loopback")
    assert config_mod.load(env={**env, "MIYAMOTO_INSECURE_HTTP": "1"}).http_host == host
    tokens = config_mod.load(env={**env, "MIYAMOTO_API_TOKENS": "admin:" + "t" * 16})
    assert tokens.api_tokens == (("admin", "t" * 16),)
    assert tokens.redacted()["api_tokens"] == "***"


def test_a_queue_section_with_a_bad_name_is_refused_and_default_is_not_a_name_check(tmp_path):
    with pytest.raises(ConfigError, match="^queue:a b: queue names are 1-100 of"):
        load("[queue:a b]\nrate = 1\n", tmp=tmp_path)
    c = load("[queue:default]\nrate = 2\n[queue:x-1_Y]\nburst = 3\n", tmp=tmp_path)
    assert sorted(c.queues) == ["default", "x-1_Y"] and c.queue("x-1_Y").rate == 2.0


def test_redacted_masks_only_the_secrets_that_are_set():
    red = config_mod.load(env={}).redacted()
    assert [s.name for s in config_mod.SETTINGS] == list(red)
    assert (red["signing_secret"], red["api_tokens"], red["curve_secret"]) == ("", "", "")
    assert red["http"] == "127.0.0.1:8088" and red["curve_public"] == ""


def _help_of(setting_name: str) -> tuple[list[str], dict]:
    import argparse

    parser = argparse.ArgumentParser()
    config_mod.add_flags(parser)
    for action in parser._actions:
        if action.dest == setting_name:
            return action.option_strings, {"metavar": action.metavar, "help": action.help,
                                           "nargs": action.nargs, "const": action.const,
                                           "default": action.default}
    raise AssertionError(setting_name)


def test_each_flag_says_its_form_its_variable_and_its_default():
    flags, a = _help_of("replication")
    assert flags == ["--replication", "--replication-factor"]
    assert a["metavar"] == "N" and a["default"] is None and a["nargs"] is None
    assert a["help"].endswith("[env MIYAMOTO_REPLICATION; default 2]")
    assert _help_of("heartbeat_interval")[1]["help"].endswith("; default 0.5]")
    assert _help_of("http_idle_timeout")[1]["help"].endswith("; default 30]")
    assert _help_of("seeds")[1]["help"].endswith("[env MIYAMOTO_SEEDS]")  # none: not shown
    assert _help_of("node")[1]["metavar"] == "ID"
    assert _help_of("log_level")[1]["metavar"] == "LEVEL"
    flags, a = _help_of("access_log")
    assert flags == ["--access-log"] and (a["nargs"], a["const"]) == ("?", "true")
    assert a["help"].endswith("; default false]")
    assert _help_of("http")[1]["help"].endswith("; default 127.0.0.1:8088]")


def test_shown_defaults():
    shown = config_mod._shown
    assert (shown(True), shown(2.0), shown(2.5), shown(("a", "b")), shown(()), shown(3),
            shown("x")) == ("true", "2", "2.5", "a,b", "", "3", "x")


def test_the_flagless_options_are_listed_in_their_section():
    assert config_mod._unflagged([]) is None
    text = config_mod._unflagged(s for s in config_mod.SETTINGS if s.name == "curve_secret")
    lines = text.split("\n")
    assert lines[:2] == ["no flag, config file or environment only (a flag would show a "
                         "secret in", "the process list):"]
    assert lines[2].startswith("  curve_secret or MIYAMOTO_CURVE_SECRET (secret): ")
    text = config_mod._unflagged(s for s in config_mod.SETTINGS if s.name == "curve_public")
    assert "  curve_public or MIYAMOTO_CURVE_PUBLIC: " in text and "(secret)" not in text
    long = config_mod._unflagged(s for s in config_mod.SETTINGS if s.name == "signing_secret")
    assert all(len(line) <= 76 for line in long.split("\n")[2:])
    assert long.split("\n")[3].startswith("      ")  # continued lines indented


# a key pair as `miyamoto keygen` makes them (zmq.curve_keypair), for the file options
PAIR = ("rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6")


def test_the_secrets_come_from_files_named_by_their_file_variables(tmp_path):
    """A mounted secret ends in a newline, or quotes a key as an env file would: both go."""
    (tmp_path / "public").write_text(PAIR[0] + "\n")
    (tmp_path / "secret").write_text(f"'{PAIR[1]}'\n")
    (tmp_path / "tokens").write_text("admin:" + "t" * 20 + "\n")
    cfg = config_mod.load(env={"MIYAMOTO_CURVE_PUBLIC_FILE": str(tmp_path / "public"),
                               "MIYAMOTO_CURVE_SECRET_FILE": str(tmp_path / "secret"),
                               "MIYAMOTO_API_TOKENS_FILE": str(tmp_path / "tokens")})
    assert (cfg.curve_public, cfg.curve_secret) == PAIR
    assert cfg.api_tokens == (("admin", "t" * 20),)
    assert set(config_mod.FILE_OPTIONS) == {"curve_public", "curve_secret", "api_tokens",
                                            "signing_secret", "qstash_current_signing_key",
                                            "qstash_next_signing_key", "oidc_signing_key",
                                            "oidc_previous_public_key", "ed25519_signing_key", "completion_secret"}


@pytest.mark.parametrize("content,words", [
    (None, "cannot read"), ("", "is empty"), ("  \n", "is empty"), (b"\xff\xfe", "not UTF-8"),
    ("x" * 70000, "larger than"),
])
def test_a_bad_secret_file_names_the_file_option(tmp_path, content, words):
    path = tmp_path / "secret"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={"MIYAMOTO_SIGNING_SECRET_FILE": str(path)})
    assert str(info.value).startswith(f"signing_secret_file: ") and words in str(info.value)


def test_a_bad_value_in_a_secret_file_names_its_variable_and_never_quotes_it(tmp_path):
    (tmp_path / "tokens").write_text("admin:short-secret")
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={"MIYAMOTO_API_TOKENS_FILE": str(tmp_path / "tokens")})
    assert "(from MIYAMOTO_API_TOKENS_FILE)" in str(info.value)
    assert "short-secret" not in str(info.value)


def test_a_secret_and_its_file_variable_together_are_refused(tmp_path):
    (tmp_path / "tokens").write_text("admin:" + "t" * 20)
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={"MIYAMOTO_API_TOKENS_FILE": str(tmp_path / "tokens"),
                             "MIYAMOTO_API_TOKENS": "admin:" + "u" * 20})
    assert str(info.value).startswith("api_tokens_file: ")


def test_only_the_secrets_have_file_variables():
    config_mod.check_environment({"MIYAMOTO_CURVE_SECRET_FILE": "/x"})
    with pytest.raises(ConfigError) as info:
        config_mod.check_environment({"MIYAMOTO_NODE_FILE": "/x"})
    assert str(info.value).startswith("MIYAMOTO_NODE_FILE: no such option")


QSTASH_KEY = "sig_current_0123456789abcdefghijklmn"


def test_config_qstash_signing_keys_from_the_environment_are_masked():
    c = config_mod.load(env={"MIYAMOTO_QSTASH_CURRENT_SIGNING_KEY": QSTASH_KEY,
                             "MIYAMOTO_QSTASH_NEXT_SIGNING_KEY": QSTASH_KEY[::-1]})
    assert (c.qstash_current_signing_key, c.qstash_next_signing_key) == (QSTASH_KEY,
                                                                         QSTASH_KEY[::-1])
    assert config_mod.load(env={}).qstash_current_signing_key == ""
    shown = c.redacted()
    assert shown["qstash_current_signing_key"] == shown["qstash_next_signing_key"] == "***"


@pytest.mark.parametrize("env, named", [
    ({"MIYAMOTO_QSTASH_NEXT_SIGNING_KEY": QSTASH_KEY}, "qstash_current_signing_key:"),
    ({"MIYAMOTO_QSTASH_CURRENT_SIGNING_KEY": "short"}, "qstash_current_signing_key:"),
    ({"MIYAMOTO_QSTASH_CURRENT_SIGNING_KEY": QSTASH_KEY,
      "MIYAMOTO_QSTASH_NEXT_SIGNING_KEY": "has a space in it, long enough"},
     "qstash_next_signing_key:"),
])
def test_config_bad_qstash_keys_fail_naming_the_option(env, named):
    with pytest.raises(ConfigError) as info:
        config_mod.load(env=env)
    assert str(info.value).startswith(named)
    assert QSTASH_KEY not in str(info.value) and "has a space" not in str(info.value)


def test_public_url_is_checked_and_gives_the_completion_base():
    cfg = config_mod.load(env={}, flags={"data_dir": ":memory:"})
    assert cfg.public_base == "http://127.0.0.1:8088"
    cfg = config_mod.load(env={}, flags={"data_dir": ":memory:",
                                         "public_url": "https://q.example/api/"})
    assert cfg.public_base == "https://q.example/api"
    with pytest.raises(config_mod.ConfigError, match="public_url"):
        config_mod.load(env={}, flags={"data_dir": ":memory:", "public_url": "ftp://x"})


def test_tracing_needs_the_otel_packages_and_starts_with_them(tmp_path, monkeypatch):
    assert load(flags={"tracing": "true", "data_dir": str(tmp_path)}).tracing is True
    monkeypatch.setattr(config_mod, "_otel_installed", lambda: False)
    assert load(flags={"data_dir": str(tmp_path)}).tracing is False  # off: nothing needed
    with pytest.raises(ConfigError, match=r"^tracing: needs the opentelemetry packages"):
        load(flags={"tracing": "true", "data_dir": str(tmp_path)})


def test_a_client_ca_alone_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"^tls_client_ca: mutual TLS needs tls_cert and "
                                          r"tls_key too"):
        load(flags={"tls_client_ca": str(tmp_path / "ca.pem"), "data_dir": str(tmp_path)})
