"""The API's routing in-process, over a fake node: the token before the 405, the open
description, the header checks, and that the OpenAPI schemas refuse what the server
refuses (a bounded schemathesis run against a real node, tests/nodes/test_openapi.py,
may not happen on the one example that shows a disagreement: these are those examples)."""

from __future__ import annotations

import io
import secrets
from typing import Any

import jsonschema
import pytest
import ujson

from keymaker import ed_key, rsa_key
from miyamoto.delivery.identity import Identity
from miyamoto.http import auth
from miyamoto.http.api import Api
from miyamoto.http.openapi import SPEC
from miyamoto.tasks.validate import Limits

pytestmark = pytest.mark.timeout(30)

ADMIN, ENQ, READ = (secrets.token_urlsafe(24) for _ in range(3))


class Service:
    """What the routes under test ask of the node; records what reached it."""

    node_id = "n1"

    def __init__(self) -> None:
        self.enqueued: list[Any] = []
        self.listed: list[tuple[str, str, int]] = []

    def enqueue(self, task: Any, again: Any = None) -> dict[str, Any]:
        self.enqueued.append(task)
        return {"status": "scheduled", "id": task.id, "queue": task.queue, "eta": task.eta,
                "name": task.name, "replicas": ["n1"]}

    def list_tasks(self, queue: str, state: Any, limit: int) -> list[dict[str, Any]]:
        self.listed.append((queue, state.value, limit))
        return []

    def control(self, queue: str, action: str) -> dict[str, Any]:
        return {"status": "ok", "queue": queue, "action": action}

    def is_pull(self, queue: str) -> bool:
        return False

    def clock_offset(self) -> float:
        return 0.0


def call(app: Api, path: str, method: str = "GET", query: str = "", token: str | None = None,
         body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, dict, Any]:
    seen: dict[str, Any] = {}

    def start_response(status: str, hdrs: list) -> None:
        seen["status"], seen["headers"] = int(status.split()[0]), dict(hdrs)

    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
               "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)),
               "CONTENT_TYPE": "application/json" if body else ""}
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    for k, v in (headers or {}).items():
        # as the server hands a header on: its bytes (UTF-8 from a client) read as latin-1
        environ["HTTP_" + k.upper().replace("-", "_")] = v.encode("utf-8").decode("latin-1")
    out = b"".join(app(environ, start_response))
    ctype = seen["headers"].get("Content-Type", "")
    return seen["status"], seen["headers"], ujson.loads(out) if "json" in ctype else out


def guarded() -> Api:
    tokens = auth.Tokens([("admin", ADMIN), ("enqueue", ENQ), ("read", READ)])
    return Api(Service(), Limits(), max_batch=10, tokens=tokens)  # type: ignore[arg-type]


def test_the_token_is_checked_before_the_405() -> None:
    app = guarded()
    # an admin route: no token 401, a weaker scope 403, only admin learns the methods
    for token, status in ((None, 401), ("x" * 30, 401), (READ, 403), (ENQ, 403)):
        got, headers, body = call(app, "/queues/q/pause", "GET", token=token)
        assert got == status, (token, body)
        assert "Allow" not in headers
    got, headers, _ = call(app, "/queues/q/pause", "GET", token=ADMIN)
    assert got == 405 and headers["Allow"] == "POST"
    # a route one of whose methods enqueue may use: enqueue is told the methods
    assert call(app, "/queue", "GET")[0] == 401
    got, headers, _ = call(app, "/queue", "GET", token=ENQ)
    assert got == 405 and headers["Allow"] == "POST"
    # an open route answers its 405 to anyone
    got, headers, _ = call(app, "/healthz", "POST")
    assert got == 405 and headers["Allow"] == "GET, HEAD"


def test_the_description_is_open_like_the_dashboard() -> None:
    app = guarded()
    got, _, body = call(app, "/openapi.json")
    assert got == 200 and body["openapi"].startswith("3.1")
    assert SPEC["paths"]["/openapi.json"]["get"]["security"] == []
    assert call(app, "/queues")[0] == 401  # the data stays guarded


def test_the_published_keys_are_open_cacheable_and_404_without_a_key() -> None:
    tokens = auth.Tokens([("admin", ADMIN)])
    bare = Api(Service(), Limits(), max_batch=10, tokens=tokens)  # type: ignore[arg-type]
    for path in ("/.well-known/openid-configuration", "/.well-known/jwks.json",
                 "/.well-known/webhook-public-key"):
        got, _, body = call(bare, path)
        assert got == 404 and "signs no" in body["error"], path
        assert SPEC["paths"][path]["get"]["security"] == []
    ident = Identity("https://tasks.example", rsa_key(), (), ed25519_key=ed_key())
    app = Api(Service(), Limits(), max_batch=10, tokens=tokens,  # type: ignore[arg-type]
              identity=ident)
    got, headers, body = call(app, "/.well-known/openid-configuration")
    assert got == 200 and body == ident.discovery()
    assert body["jwks_uri"] == "https://tasks.example/.well-known/jwks.json"
    assert headers["Cache-Control"] == "public, max-age=60"
    got, headers, body = call(app, "/.well-known/jwks.json")
    assert got == 200 and body == ident.jwks() and headers["Cache-Control"].startswith("public")
    got, _, body = call(app, "/.well-known/webhook-public-key")
    assert got == 200 and body["public_key"].startswith("whpk_")
    for name, doc in (("OpenIDConfiguration", ident.discovery()), ("JWKS", ident.jwks()),
                      ("WebhookPublicKey", ident.webhook_public_key())):
        assert _valid(SPEC["components"]["schemas"][name], doc), name


def _enqueue(app: Api, key: str) -> tuple[int, Any]:
    task = ujson.dumps({"url": "http://127.0.0.1:9/w"}).encode()
    got, _, body = call(app, "/queue", "POST", body=task, headers={"Idempotency-Key": key})
    return got, body


def test_an_idempotency_key_must_be_a_name_a_header_can_carry() -> None:
    app = Api(Service(), Limits(), max_batch=10)  # type: ignore[arg-type]
    got, body = _enqueue(app, "")
    assert got == 400 and body["field"] == "Idempotency-Key" and "empty" in body["error"]
    got, body = _enqueue(app, "order-\N{GRINNING FACE}")
    assert got == 400 and body["field"] == "Idempotency-Key", body
    assert "UTF-8" in body["error"] and "control" not in body["error"]
    got, body = _enqueue(app, "order-1")
    assert got == 200 and body["name"] == "order-1"
    assert app.service.enqueued[-1].name == "order-1"  # type: ignore[attr-defined]


def test_an_emoji_in_a_task_header_is_named_for_what_it_is() -> None:
    app = Api(Service(), Limits(), max_batch=10)  # type: ignore[arg-type]
    task = {"url": "http://127.0.0.1:9/w", "headers": {"X-Mood": "\N{GRINNING FACE}"}}
    got, _, body = call(app, "/queue", "POST", body=ujson.dumps(task).encode())
    assert got == 400 and body["field"] == "headers.X-Mood", body
    assert "latin-1" in body["error"] and "control" not in body["error"]
    task["headers"] = {"X-Bell": "a\x07b"}
    got, _, body = call(app, "/queue", "POST", body=ujson.dumps(task).encode())
    assert got == 400 and "control characters" in body["error"]


def test_an_empty_limit_is_refused_naming_limit() -> None:
    app = Api(Service(), Limits(), max_batch=10)  # type: ignore[arg-type]
    for query in ("limit=", "limit=x", "limit=0", "limit=1001", "state=scheduled&limit="):
        got, _, body = call(app, "/queues/q/tasks", query=query)
        assert got == 400 and body["field"] == "limit", (query, body)
    got, _, _ = call(app, "/queues/q/tasks", query="limit=5")
    assert got == 200 and app.service.listed[-1] == ("q", "scheduled", 5)  # type: ignore


def _valid(schema: dict[str, Any], value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_the_schemas_refuse_what_the_server_refuses() -> None:
    schemas = SPEC["components"]["schemas"]
    url = "http://127.0.0.1:9/w"
    for name in ("TaskRequest", "TopicTaskRequest"):
        base = {"url": url} if name == "TaskRequest" else {"topic": "t"}
        assert _valid(schemas[name], {**base, "json": {"a": 1}})
        assert _valid(schemas[name], {**base, "body": "x"})
        assert not _valid(schemas[name], {**base, "json": None, "body": "x"}), name
    sched = schemas["ScheduleRequest"]
    task = {"url": url}
    assert _valid(sched, {"name": "s", "task": task, "cron": "0 3 * * *"})
    assert _valid(sched, {"name": "s", "task": task, "cron": "0 3 * * * 5",
                          "cron_seconds_last": True})
    assert _valid(sched, {"name": "s", "task": task, "every": 60})
    assert not _valid(sched, {"name": "s", "task": task, "cron": "0 3 * * *", "every": 60})
    assert not _valid(sched, {"name": "s", "task": task})
    assert not _valid(sched, {"name": "s", "task": task, "every": 60,
                              "cron_seconds_last": False})
    key = next(p for p in SPEC["paths"]["/queue"]["post"]["parameters"]
               if p["name"] == "Idempotency-Key")
    assert key["schema"]["minLength"] == 1  # and the server refuses "" (above)
