"""One validated, frozen configuration: defaults <- INI <- MIYAMOTO_* environment <- flags.

Each option is declared once (``Setting``) with its type, default, validator and help,
as gunicorn does; the INI file, the environment and the command line all read that one
table, so an option cannot exist in one place and not another. Queue settings live in
``[queue:NAME]`` sections; ``[node:ID]`` sections let one file describe a whole cluster
(``miyamoto serve --config cluster.example.ini --node a``).
"""

from __future__ import annotations

import argparse
import configparser
import dataclasses
import difflib
import functools
import importlib.util
import ipaddress
import os
import socket
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from miyamoto.config import values as value


class ConfigError(ValueError):
    """A bad option value; the message names the option."""


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    flag: bool = True  # exposed as --name on `miyamoto serve`; else config and environment only
    secret: bool = False
    group: str = ""  # its section of `miyamoto serve --help` (GROUPS)
    metavar: str = ""  # the form its flag takes; default: its parser's (values.shows)


# the sections of `miyamoto serve --help`, in order
GROUPS = {"http": "HTTP API", "cluster": "cluster", "security": "security",
          "delivery": "delivery", "storage": "storage", "logs": "logs"}


def _group(group: str, *settings: Setting) -> tuple[Setting, ...]:
    return tuple(dataclasses.replace(s, group=group) for s in settings)


SETTINGS: tuple[Setting, ...] = (*_group(
    "http",
    Setting("http", value.hostport, "127.0.0.1:8088", "HTTP API address HOST:PORT"),
    Setting("reuse_port", value.boolean, False, "bind the HTTP port with SO_REUSEPORT (set by --processes)"),
    Setting("public_url", value.public_url, "", "the base URL workers reach this node's API "
            "at, for the completion URL of a long task's attempt (default: http(s)://HTTP)"),
    Setting("http_header_timeout", value.float_ge(0.1), 10.0,
            "seconds a client has to send a request's headers and body"),
    Setting("http_idle_timeout", value.float_ge(0.1), 30.0, "seconds an idle keep-alive connection stays open"),
    Setting("max_header_bytes", value.int_ge(1024), 65536, "largest request header block, bytes (431 beyond)"),
    Setting("max_connections", value.int_ge(16), 10000, "HTTP connections open at once"),
    Setting("max_body", value.int_ge(1), 1024 * 1024, "largest enqueue request body, bytes"),
    Setting("max_url", value.int_ge(16), 2083, "longest target URL"),
    Setting("max_delay", value.float_ge(0), 30 * 86400.0, "longest countdown / farthest eta, seconds"),
    Setting("max_name", value.int_ge(1), 500, "longest task name"),
    Setting("max_batch", value.int_ge(1), 1000, "most tasks in one batch request"),
    Setting("tls_cert", value.stripped, "", "PEM certificate (chain after it) to serve the "
            "HTTP API over https; reloaded with tls_key on SIGHUP", metavar="PATH"),
    Setting("tls_key", value.stripped, "", "PEM private key of tls_cert (unencrypted)",
            metavar="PATH"),
    Setting("tls_client_ca", value.stripped, "", "PEM CA certificates: with them every HTTP "
            "client must show a certificate one signed (mutual TLS)", metavar="PATH"),
), *_group(
    "cluster",
    Setting("node", lambda v: value.node_id(v), "", "this node's id (default: HOSTNAME-HTTPPORT, "
            "HOSTNAME-HTTPHOST-HTTPPORT when the HTTP host is not 127.0.0.1, localhost or 0.0.0.0)",
            metavar="ID"),
    Setting("cluster", value.zmq_endpoint, "tcp://127.0.0.1:6000", "cluster (ZeroMQ) endpoint"),
    Setting("advertise", value.stripped, "", "cluster endpoint peers use to reach this node (default: cluster)",
            metavar="tcp://HOST:PORT"),
    Setting("seeds", value.seeds, (), "comma-separated cluster endpoints of other nodes to join"),
    Setting("zone", value.node_id, "", "this node's failure domain: copies of a task go to distinct "
            "zones (default: the host name)"),
    Setting("processes", value.int_ge(1), 1, "nodes to run on this host, sharing the HTTP port "
            "(SO_REUSEPORT), on consecutive cluster ports"),
    Setting("replication", value.int_ge(1), 2, "copies of each task (replication_factor)"),
    Setting("min_replicas", value.int_ge(1), 1, "copies that must be stored before enqueue answers 200"),
    Setting("replica_offset", value.float_ge(0), 5.0, "seconds between the fire times of successive replicas"),
    Setting("replication_timeout", value.float_ge(0.01), 2.0, "seconds to wait for replicas to answer STORED"),
    Setting("heartbeat_interval", value.float_ge(0.01), 0.5, "leader heartbeat period, seconds"),
    Setting("failure_timeout", value.float_ge(0.05), 3.0, "a member silent this long is dropped"),
    Setting("election_timeout_min", value.float_ge(0.05), 1.5, "election timeout lower bound"),
    Setting("election_timeout_max", value.float_ge(0.05), 3.0, "election timeout upper bound"),
    Setting("max_clock_skew", value.float_ge(0.001), 1.0,
            "a member's clock further off than this, seconds, is logged as an error"),
    Setting("claim_lease", value.float_ge(0.1), 60.0, "extra seconds a claimed task is held off its siblings"),
), *_group(
    "security",
    Setting("curve_public", value.z85_key, "", "cluster CurveZMQ public key (Z85)", flag=False),
    Setting("curve_secret", value.z85_key, "", "cluster CurveZMQ secret key (Z85)", flag=False, secret=True),
    Setting("insecure_cluster", value.boolean, False,
            "allow a cluster without CurveZMQ keys (plain TCP: anyone who reaches the port is a peer)"),
    Setting("api_tokens", value.parse_tokens, (), "bearer tokens SCOPE:TOKEN,... (scopes admin, enqueue, read)",
            flag=False, secret=True),
    Setting("insecure_http", value.boolean, False, "allow an HTTP address beyond loopback without api_tokens"),
    Setting("target_allow", value.cidrs, (), "CIDR blocks tasks may target even when denied (allow wins)"),
    Setting("target_deny", value.cidrs, (), "CIDR blocks tasks may not target, beyond the built-in list "
            "(link-local, cloud metadata, 0.0.0.0/8, multicast, broadcast, the cluster's endpoints)"),
    Setting("signing_secret", value.secret, (),
            "Standard Webhooks secrets whsec_..., comma- or space-separated (rotation): "
            "each delivery is signed with every one", flag=False, secret=True),
    Setting("completion_secret", value.signing_key, "",
            "the key that signs the completion tokens of long tasks and pull leases, the same "
            "on every node (16-200 characters); unset: derived from signing_secret, else from "
            "curve_secret, else random at each start (a token is then checked only by the "
            "node that made it, until it stops)",
            flag=False, secret=True),
    Setting("qstash_current_signing_key", value.signing_key, "",
            "QStash signing key: every delivery carries an Upstash-Signature JWT signed with it",
            flag=False, secret=True),
    Setting("qstash_next_signing_key", value.signing_key, "",
            "QStash's next signing key (rotation: a worker's Receiver also tries it)",
            flag=False, secret=True),
    Setting("oidc_issuer", value.issuer_url, "", "URL naming this cluster in its OIDC tokens "
            "(iss); targets fetch ISSUER/.well-known/openid-configuration from it",
            metavar="URL"),
    Setting("oidc_signing_key", value.stripped, "", "PEM private key (RSA: RS256, or EC "
            "P-256: ES256) that signs the OIDC tokens a queue's or task's oidc_audience asks "
            "for; the same on every node", flag=False, secret=True),
    Setting("oidc_previous_public_key", value.stripped, "", "PEM public keys of retired "
            "OIDC signing keys, kept in /.well-known/jwks.json: keep one for the token "
            "lifetime (5 minutes) after every node signs with the new key", flag=False),
    Setting("ed25519_signing_key", value.stripped, "", "Standard Webhooks whsk_... (or PEM) "
            "Ed25519 key: the v1a, signatures of the queues whose signature says so; its "
            "public key is served at /.well-known/webhook-public-key", flag=False, secret=True),
), *_group(
    "delivery",
    Setting("concurrency", value.int_ge(1), 512, "deliveries in flight on this node, all queues"),
    Setting("max_per_host", value.int_ge(1), 128, "deliveries in flight to one target host"),
    Setting("breaker_failures", value.int_ge(0), 10, "consecutive failed attempts (connection "
            "errors, timeouts, 5xx, 429) that open a target origin's circuit breaker; 0: never"),
    Setting("breaker_cooldown", value.float_ge(0.01), 30.0, "seconds an open breaker waits before "
            "one probe delivery (doubled after each failed probe, up to 10x)"),
    Setting("callback_timeout", value.float_ge(0.1), 30.0, "dispatch deadline for callback tasks"),
    Setting("schedule_catch_up", lambda v: value.one_of(v, ("last", "none")), "last",
            "a schedule's ticks missed while no leader existed: last (the newest fires once) "
            "or none (skipped); a schedule's catch_up field overrides it", metavar="last|none"),
    Setting("shutdown_timeout", value.float_ge(0), 10.0, "seconds in-flight deliveries get on stop"),
    Setting("auto_create_queues", value.boolean, True, "an enqueue to an unknown queue creates "
            "it (up to max_queues); off: only queues declared by [queue:NAME] sections take tasks"),
    Setting("max_queues", value.int_ge(1), 1000, "queues this node holds at most, declared ones "
            "included: an enqueue that would create one more gets 400 naming queue"),
    Setting("queue_idle_expiry", value.float_ge(0), 3600.0, "seconds after its last enqueue "
            "an auto-created queue with no task in it is forgotten; 0: never"),
), *_group(
    "storage",
    Setting("data_dir", value.stripped, "./miyamoto-data", "journal directory, or :memory: for no disk",
            metavar="PATH"),
    Setting("memory_window", value.float_ge(1), 60.0,
            "seconds ahead whose tasks are held in memory; later ones live only in the journal"),
    Setting("retention", value.float_ge(0), 86400.0, "seconds a finished task stays readable"),
    Setting("dedup_window", value.float_ge(0), 3600.0, "seconds a task name stays reserved"),
), *_group(
    "logs",
    Setting("log_level", value.level, "INFO", "debug, info, warning, error"),
    Setting("log_format", value.log_format, "text",
            "text, or json: one JSON object a line (time, level, logger, message, exception)"),
    Setting("access_log", value.boolean, False, "log one line per HTTP request (no query string)"),
    Setting("tracing", value.boolean, False, "OpenTelemetry traces of enqueues, stores and "
            "attempts, exported by OTLP/HTTP as the OTEL_* variables say (needs the otel "
            "extra: pip install miyamoto[otel]); also on when OTEL_EXPORTER_OTLP_ENDPOINT is set"),
))


_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class QueueConfig:
    """A queue's limits; Cloud Tasks' RateLimits and RetryConfig in one record."""

    name: str = "default"
    rate: float = 0.0  # dispatches per second for the whole cluster; 0 = unlimited
    burst: int = 100
    max_concurrent: int = 0  # deliveries in flight on one node; 0 = half of concurrency
    max_attempts: int = 25
    min_backoff: float = 0.5
    max_backoff: float = 3600.0
    max_doublings: int = 16
    max_retry_duration: float = 0.0  # 0 = no limit
    timeout: float = 30.0
    paused: bool = False
    # push: due tasks are POSTed to their url; pull: they wait for a worker to lease them
    # (POST /queues/<name>/lease, engine/pull.py) and are never POSTed anywhere
    mode: str = "push"
    # who the deliveries say they are (config only: miyamoto.delivery.identity)
    oidc_audience: str = ""  # an OIDC token for this audience on each delivery; "": none
    signature: str = "auto"  # SIGNATURES: which webhook-signature schemes are sent
    # the way out (config only: miyamoto.delivery.egress): files and a URL on this node
    tls_client_cert: str = ""  # PEM certificate (chain) shown to targets that ask for one
    tls_client_key: str = ""  # its unencrypted PEM key
    tls_ca_bundle: str = ""  # PEM CAs trusted for this queue's https targets, instead of the system's
    # http://[user:password@]host:port: every delivery through CONNECT (no repr: a password)
    proxy_url: str = field(default="", repr=False)
    # the options the INI set for it ([queue:NAME] or [queue:default]): GET /queues/<name>
    # tells a value the config gave from a built-in default
    given: frozenset[str] = field(default=frozenset(), compare=False)


QUEUE_MODES = ("push", "pull")
QUEUE_FIELDS: dict[str, Callable[[str], Any]] = {
    "rate": value.float_ge(0),
    "burst": value.int_ge(1),
    "max_concurrent": value.int_ge(0),
    "max_attempts": value.int_ge(1),
    "min_backoff": value.float_ge(0),
    "max_backoff": value.float_ge(0),
    "max_doublings": value.int_ge(0),
    "max_retry_duration": value.float_ge(0),
    "timeout": value.float_ge(0.01),
    "paused": value.boolean,
    "mode": lambda v: value.one_of(v, QUEUE_MODES),
}
# webhook-signature per queue: auto (every scheme whose key is set), hmac (v1, with
# signing_secret), ed25519 (v1a, with ed25519_signing_key), both, or none
SIGNATURES = ("auto", "hmac", "ed25519", "both", "none")
# [queue:NAME] options the API does not set (they need the node's keys)
QUEUE_CALLER_FIELDS: dict[str, Callable[[str], Any]] = {
    "oidc_audience": value.audience,
    "signature": lambda v: value.one_of(v, SIGNATURES),
}
# [queue:NAME] options of the way out: files and a proxy on this node, not set by the API
QUEUE_EGRESS_FIELDS: dict[str, Callable[[str], Any]] = {
    "tls_client_cert": value.stripped,
    "tls_client_key": value.stripped,
    "tls_ca_bundle": value.stripped,
    "proxy_url": value.proxy_url,
}


@dataclass(frozen=True)
class Config:
    node: str
    http: str
    cluster: str
    advertise: str
    processes: int
    reuse_port: bool
    zone: str
    seeds: tuple[str, ...]
    data_dir: str
    replication: int
    min_replicas: int
    replica_offset: float
    replication_timeout: float
    heartbeat_interval: float
    failure_timeout: float
    election_timeout_min: float
    election_timeout_max: float
    curve_public: str
    curve_secret: str
    insecure_cluster: bool
    api_tokens: tuple[tuple[str, str], ...]
    insecure_http: bool
    target_allow: tuple[str, ...]
    target_deny: tuple[str, ...]
    public_url: str
    http_header_timeout: float
    http_idle_timeout: float
    max_header_bytes: int
    max_connections: int
    max_per_host: int
    breaker_failures: int
    breaker_cooldown: float
    signing_secret: tuple[str, ...]
    completion_secret: str
    qstash_current_signing_key: str
    qstash_next_signing_key: str
    oidc_issuer: str
    oidc_signing_key: str
    oidc_previous_public_key: str
    ed25519_signing_key: str
    log_level: str
    log_format: str
    access_log: bool
    tracing: bool
    max_body: int
    max_url: int
    max_delay: float
    max_name: int
    max_batch: int
    tls_cert: str
    tls_key: str
    tls_client_ca: str
    dedup_window: float
    schedule_catch_up: str
    retention: float
    memory_window: float
    concurrency: int
    shutdown_timeout: float
    max_clock_skew: float
    claim_lease: float
    callback_timeout: float
    auto_create_queues: bool
    max_queues: int
    queue_idle_expiry: float
    queues: Mapping[str, QueueConfig] = field(default_factory=dict)

    @property
    def http_host(self) -> str:
        return self.http.rpartition(":")[0]

    @property
    def http_port(self) -> int:
        return int(self.http.rpartition(":")[2])

    @property
    def public_base(self) -> str:
        """The base URL of this node's API as workers reach it (completion URLs)."""
        return self.public_url or f"{'https' if self.tls_cert else 'http'}://{self.http}"

    def queue(self, name: str) -> QueueConfig:
        """The declared queue, or a new one with [queue:default]'s values."""
        q = self.queues.get(name)
        if q is None:
            q = _named(self.queues.get("default", QueueConfig()), name)
        return q

    def redacted(self) -> dict[str, Any]:
        """Every option, secrets masked: safe to log or serve."""
        out: dict[str, Any] = {}
        for s in SETTINGS:
            v = getattr(self, s.name)
            out[s.name] = ("***" if v else "") if s.secret else v
        return out


@functools.lru_cache(maxsize=4096)
def _named(default: QueueConfig, name: str) -> QueueConfig:
    """[queue:default]'s values under another name: GET /queues asks for a thousand at
    max_queues, and dataclasses.replace costs ~20 us each."""
    return dataclasses.replace(default, name=name)


def _env_name(name: str) -> str:
    return "MIYAMOTO_" + name.upper()


def _read_ini(path: str, node: str | None) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except (OSError, configparser.Error) as e:
        raise ConfigError(f"config: cannot read {path}: {e}") from e
    values: dict[str, str] = {}
    queues: dict[str, dict[str, str]] = {}
    for section in parser.sections():
        items = dict(parser.items(section))
        if section == "miyamoto":
            values.update(items)
        elif section.startswith("queue:"):
            queues[section[len("queue:"):]] = items
        elif section.startswith("node:"):
            continue
        else:
            raise ConfigError(f"config: unknown section [{section}] in {path}")
    if node:
        section = f"node:{node}"
        if parser.has_section(section):
            values.update(dict(parser.items(section)))
            values.setdefault("node", node)
        elif any(s.startswith("node:") for s in parser.sections()):
            raise ConfigError(f"node: no [node:{node}] section in {path}")
    return values, queues


def _parse_queue(name: str, raw: Mapping[str, str], base: QueueConfig) -> QueueConfig:
    values: dict[str, Any] = {}
    for key, text in raw.items():
        parse = (QUEUE_FIELDS.get(key) or QUEUE_CALLER_FIELDS.get(key)
                 or QUEUE_EGRESS_FIELDS.get(key))
        if parse is None:
            raise ConfigError(f"queue:{name}.{key}: unknown queue option")
        try:
            values[key] = parse(text)
        except ValueError as e:
            raise ConfigError(f"queue:{name}.{key}: {e}") from e
    q = dataclasses.replace(base, name=name, given=base.given | frozenset(values), **values)
    if q.max_backoff < q.min_backoff:
        raise ConfigError(f"queue:{name}.max_backoff: must be >= min_backoff")
    if {"tls_client_cert", "tls_client_key", "tls_ca_bundle"} & set(values):
        _check_queue_tls(q)  # a queue that takes [queue:default]'s files was checked there
    return q


def _check_queue_tls(q: QueueConfig) -> None:
    """A queue's client certificate, key and CA bundle must build its delivery context
    (the same build as the delivery client's), or the node does not start."""
    from miyamoto.config.tls import TLSFileError, client_context  # ssl: after the patching

    try:
        client_context(q.tls_client_cert, q.tls_client_key, q.tls_ca_bundle)
    except TLSFileError as e:
        raise ConfigError(f"queue:{q.name}.{e.option}: {e.message}") from None


# MIYAMOTO_* variables that are not serve options: the config file, the client commands'
# node, token (MIYAMOTO_API_TOKEN: the token's older name) and TLS files, the tests'
# screenshots dir
OTHER_VARIABLES = ("MIYAMOTO_CONFIG", "MIYAMOTO_SERVER", "MIYAMOTO_TOKEN", "MIYAMOTO_API_TOKEN",
                   "MIYAMOTO_CACERT", "MIYAMOTO_CLIENT_CERT", "MIYAMOTO_CLIENT_KEY",
                   "MIYAMOTO_ARTIFACTS")


# the options that MIYAMOTO_<NAME>_FILE may also give, as the file's text: the secrets and
# the public key beside its secret, for keys and tokens mounted as files (a Kubernetes or
# compose secret) rather than left in the environment, where child processes inherit them
FILE_OPTIONS = tuple(s.name for s in SETTINGS
                     if s.secret or s.name in ("curve_public", "oidc_previous_public_key"))
MAX_SECRET_FILE = 65536  # bytes; a secret file is a few hundred


def check_environment(env: Mapping[str, str]) -> None:
    """A MIYAMOTO_* variable that nothing reads is a typo to report, not to ignore (a
    misspelt MIYAMOTO_REPLICATON would leave the default in force without a word)."""
    known = ({_env_name(s.name) for s in SETTINGS} | set(OTHER_VARIABLES)
             | {_env_name(name) + "_FILE" for name in FILE_OPTIONS})
    for name in sorted(env):
        if name.startswith("MIYAMOTO_") and name not in known:
            raise ConfigError(f"{name}: no such option{_closest(name, sorted(known))} "
                              "(`miyamoto serve --help` lists them)")


def _closest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _gather(config_file: str | None, env: Mapping[str, str], flags: dict[str, Any]
            ) -> tuple[dict[str, Any], dict[str, str], dict[str, dict[str, str]]]:
    """Each option's raw text (INI <- environment <- flags), where it came from (for the
    error message), and the raw [queue:NAME] sections."""
    config_file = flags.pop("config", None) or env.get("MIYAMOTO_CONFIG") or config_file
    node_hint = flags.get("node") or env.get(_env_name("node"))
    raw: dict[str, Any] = {}
    raw_queues: dict[str, dict[str, str]] = {}
    if config_file:
        raw, raw_queues = _read_ini(config_file, node_hint)
    source = {key: f"config file {config_file}" for key in raw}
    for key in raw:
        if key not in _BY_NAME:
            raise ConfigError(f"{key}: unknown option in {config_file}"
                              + _closest(key, sorted(_BY_NAME)))
    for s in SETTINGS:
        if _env_name(s.name) in env:
            raw[s.name], source[s.name] = env[_env_name(s.name)], _env_name(s.name)
    for name in FILE_OPTIONS:
        variable = _env_name(name) + "_FILE"
        if variable in env:
            if _env_name(name) in env:
                raise ConfigError(f"{name}_file: {variable} and {_env_name(name)} are both set; "
                                  "give one of them")
            raw[name], source[name] = _read_secret_file(name, env[variable]), variable
    for key, v in flags.items():
        if key not in _BY_NAME:
            raise ConfigError(f"{key}: unknown option")
        raw[key], source[key] = v, "--" + key.replace("_", "-")
    return raw, source, raw_queues


def _read_secret_file(name: str, path: str) -> str:
    """The text of the file MIYAMOTO_<NAME>_FILE names, surrounding white space dropped (a
    mounted secret often ends in a newline); the error names the option, never the text."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_FILE + 1)
    except OSError as e:
        raise ConfigError(f"{name}_file: cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_SECRET_FILE:
        raise ConfigError(f"{name}_file: {path} is larger than {MAX_SECRET_FILE} bytes")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{name}_file: {path} is not UTF-8 text") from None
    if not text:
        raise ConfigError(f"{name}_file: {path} is empty")
    return text


def load(config_file: str | None = None, env: Mapping[str, str] | None = None,
         flags: Mapping[str, Any] | None = None) -> Config:
    """Build the frozen Config; raise ConfigError naming the bad option."""
    env = os.environ if env is None else env
    check_environment(env)
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    raw, source, raw_queues = _gather(config_file, env, flags)
    values: dict[str, Any] = {}
    for s in SETTINGS:
        if s.name in raw:
            try:
                values[s.name] = s.parse(raw[s.name])
            except (ValueError, TypeError) as e:
                raise ConfigError(f"{s.name}: {e} (from {source[s.name]})") from e
        else:
            values[s.name] = s.default
    if not values["node"]:
        values["node"] = default_node_id(socket.gethostname(), values["http"])
    if not values["zone"]:
        values["zone"] = socket.gethostname() or values["node"]
    if not values["advertise"]:
        values["advertise"] = values["cluster"]
    else:
        try:
            values["advertise"] = value.zmq_endpoint(values["advertise"])
        except ValueError as e:
            raise ConfigError(f"advertise: {e} (from {source['advertise']})") from e
    if values["election_timeout_max"] < values["election_timeout_min"]:
        raise ConfigError("election_timeout_max: must be >= election_timeout_min")
    if values["qstash_next_signing_key"] and not values["qstash_current_signing_key"]:
        raise ConfigError("qstash_current_signing_key: a next key needs a current one "
                          "(deliveries are signed with the current key)")
    if bool(values["curve_public"]) != bool(values["curve_secret"]):
        raise ConfigError("curve_secret: curve_public and curve_secret go together")
    _check_cluster_keys(values)
    _check_http_exposure(values)
    _check_tls(values)
    _check_caller_keys(values)
    if values["tracing"] and not _otel_installed():
        raise ConfigError("tracing: needs the opentelemetry packages: pip install 'miyamoto[otel]'")
    if values["curve_public"]:
        from miyamoto.wire.transport import CurveKeys  # gevent, libzmq: only for a key pair

        try:
            CurveKeys(values["curve_public"], values["curve_secret"])
        except ValueError as e:
            raise ConfigError(f"curve_secret: {e}") from None
    default_q = _parse_queue("default", raw_queues.get("default", {}), QueueConfig())
    queues = {"default": default_q}
    for name, items in raw_queues.items():
        if name != "default":
            _check_queue_name(name)
            queues[name] = _parse_queue(name, items, default_q)
    for q in queues.values():
        _check_queue_keys(q, values)
    if len(queues) > values["max_queues"]:
        raise ConfigError(f"max_queues: {values['max_queues']} is below the {len(queues)} "
                          "queues the config declares (default included)")
    return Config(queues=queues, **values)


PLAIN_HTTP_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0")


def default_node_id(hostname: str, http: str) -> str:
    """A node's id when ``node`` is not set: ``HOSTNAME-PORT``, with the HTTP host in it
    (``HOSTNAME-HOST-PORT``) unless it is one of ``PLAIN_HTTP_HOSTS``.

    Why the HTTP address: an id must be unique among the live nodes and stable across
    restarts. Two live nodes on one host never listen on the same HTTP host and port (the
    second bind fails), and those three hosts cannot be bound together on one port, so
    this is unique per host; the cluster port is not (a keyless node binds none), nor is
    the data dir (a relative path). Nodes on 127.0.0.2-4:8088 used to all take
    ``HOSTNAME-8088`` and never formed a cluster; a node on 127.0.0.1 keeps its old id.
    """
    host, _, port = http.rpartition(":")
    host = host.strip("[]")
    if not host or host in PLAIN_HTTP_HOSTS:
        return f"{hostname}-{port}"
    return f"{hostname}-{host.replace(':', '.')}-{port}"


def _check_cluster_keys(values: Mapping[str, Any]) -> None:
    """Peers only with the cluster key pair: a node that would talk to others without one
    refuses to start, unless the operator says ``insecure_cluster = true`` out loud."""
    own = (values["cluster"], values["advertise"])
    others = [s for s in values["seeds"] if s not in own]
    if others and not values["curve_secret"] and not values["insecure_cluster"]:
        raise ConfigError(
            "curve_secret: a node with seeds needs the cluster key pair (curve_public and "
            "curve_secret; make one with `miyamoto keygen` and give it to every node), "
            "or insecure_cluster = true for unauthenticated plain TCP")


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def _check_http_exposure(values: Mapping[str, Any]) -> None:
    """An API reachable beyond this machine must ask for tokens, unless told otherwise."""
    host = values["http"].rpartition(":")[0]
    if not _is_loopback(host) and not values["api_tokens"] and not values["insecure_http"]:
        raise ConfigError(
            f"api_tokens: http binds {host}, beyond loopback, so the API needs tokens "
            "(api_tokens = admin:TOKEN,... or MIYAMOTO_API_TOKENS), "
            "or insecure_http = true to serve it open")


def _otel_installed() -> bool:
    """Whether tracing could start (the SDK is found; nothing is imported)."""
    try:
        return importlib.util.find_spec("opentelemetry.sdk") is not None
    except ImportError:  # no opentelemetry package at all
        return False


def _check_tls(values: Mapping[str, Any]) -> None:
    """Certificate and key go together, a client CA needs them, and the files must serve
    (the same build as the server's, so a start that passes here serves)."""
    cert, key, ca = values["tls_cert"], values["tls_key"], values["tls_client_ca"]
    if bool(cert) != bool(key):
        raise ConfigError(f"{'tls_key' if cert else 'tls_cert'}: tls_cert and tls_key go together")
    if ca and not cert:
        raise ConfigError("tls_client_ca: mutual TLS needs tls_cert and tls_key too")
    if cert:
        # imported here: ssl must load after serve's monkey-patching (an ssl imported
        # before it recurses in SSLContext.minimum_version), and the CLI's parser before it
        from miyamoto.config.tls import TLSFileError, server_context

        try:
            server_context(cert, key, ca)
        except TLSFileError as e:
            raise ConfigError(str(e)) from None


def _check_caller_keys(values: Mapping[str, Any]) -> None:
    """The OIDC options go together and every key must parse (the errors name the
    option, never a key's text)."""
    issuer, key = values["oidc_issuer"], values["oidc_signing_key"]
    if bool(issuer) != bool(key):
        raise ConfigError("oidc_issuer: oidc_issuer and oidc_signing_key go together" if key
                          else "oidc_signing_key: oidc_issuer needs the key that signs the tokens")
    if values["oidc_previous_public_key"] and not key:
        raise ConfigError("oidc_previous_public_key: needs oidc_signing_key (the current key)")
    if not (key or values["ed25519_signing_key"]):
        return
    from miyamoto.config import keys  # cryptography: only for a node given a key

    for name, parse in (("oidc_signing_key", keys.oidc_private_key),
                        ("oidc_previous_public_key", keys.oidc_public_keys),
                        ("ed25519_signing_key", keys.ed25519_private_key)):
        if values[name]:
            try:
                parse(values[name])
            except ValueError as e:
                raise ConfigError(f"{name}: {e}") from None


def _check_queue_keys(q: QueueConfig, values: Mapping[str, Any]) -> None:
    """A queue that asks for a token or a signature scheme needs that scheme's key."""
    if q.oidc_audience and not values["oidc_signing_key"]:
        raise ConfigError(f"queue:{q.name}.oidc_audience: needs oidc_signing_key and oidc_issuer")
    if q.signature in ("hmac", "both") and not values["signing_secret"]:
        raise ConfigError(f"queue:{q.name}.signature: {q.signature} needs signing_secret")
    if q.signature in ("ed25519", "both") and not values["ed25519_signing_key"]:
        raise ConfigError(f"queue:{q.name}.signature: {q.signature} needs ed25519_signing_key")


def _check_queue_name(name: str) -> None:
    # one definition of a valid queue name; imported here, as only a [queue:NAME] section
    # needs it, so the CLI does not load the task record (about 10 ms) to build its parser
    from miyamoto.tasks.task import QUEUE_NAME_RE

    if not QUEUE_NAME_RE.fullmatch(name):
        raise ConfigError(f"queue:{name}: queue names are 1-100 of [A-Za-z0-9_-]")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add --config and one flag per Setting (dest = the setting's name), in the sections
    of GROUPS; each section lists its options that have no flag (secrets: a flag would
    show in the process list) with their environment variables."""
    parser.add_argument("--config", metavar="PATH",
                        help="INI file (see cluster.example.ini) [env MIYAMOTO_CONFIG]")
    for key, title in GROUPS.items():
        members = [s for s in SETTINGS if s.group == key]
        group = parser.add_argument_group(title, _unflagged(m for m in members if not m.flag))
        for s in members:
            if s.flag:
                _add_flag(group, s)


def _add_flag(group: Any, s: Setting) -> None:
    flags = ["--" + s.name.replace("_", "-")]
    if s.name == "replication":
        flags.append("--replication-factor")
    kw: dict[str, Any] = {}
    if s.parse is value.boolean:  # --access-log alone means true; --access-log false works
        kw.update(nargs="?", const="true")
    default = _shown(s.default)
    where = f"env {_env_name(s.name)}" + (f"; default {default}" if default else "")
    group.add_argument(*flags, dest=s.name, default=None, **kw,
                       metavar=s.metavar or getattr(s.parse, "metavar", "VALUE"),
                       help=f"{s.help} [{where}]".replace("%", "%%"))


def _shown(default: Any) -> str:
    """A default as a person would type it: 2, 0.5, true, tcp://..., "" for none."""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    if isinstance(default, tuple):
        return ",".join(map(str, default))
    return str(default)


def _unflagged(settings: Iterable[Setting]) -> str | None:
    """The section's text for its options without a flag, one per line (the serve parser
    keeps this text's lines: RawDescriptionHelpFormatter)."""
    lines = []
    for s in settings:
        text = f"{s.name} or {_env_name(s.name)}{' (secret)' if s.secret else ''}: {s.help}"
        lines.extend(textwrap.wrap(text, 76, initial_indent="  ", subsequent_indent="      "))
    if not lines:
        return None
    return "\n".join(["no flag, config file or environment only (a flag would show a secret in",
                      "the process list):", *lines])
