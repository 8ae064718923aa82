"""API tokens: 401 without a valid token, 403 for a scope that does not allow the route,
200 otherwise; probes stay open; a node beyond loopback without tokens does not start.
Real node processes; the tokens come from MIYAMOTO_API_TOKENS (a secret: env, not flags)."""

from __future__ import annotations

import secrets

import pytest

from helpers import free_port, run_cli
from miyamoto.http import auth
from miyamoto.config import settings as config

ADMIN, ENQ, READ = (secrets.token_urlsafe(24) for _ in range(3))
TOKENS = f"admin:{ADMIN},enqueue:{ENQ},read:{READ}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def guarded(node_factory):
    return node_factory("guarded", env={"MIYAMOTO_API_TOKENS": TOKENS})


def status(node, method: str, path: str, token: str | None, **kw) -> int:
    headers = bearer(token) if token else {}
    r = node.request(method, path, headers=headers, timeout=10, **kw)
    assert r.headers["Content-Type"].startswith(("application/json", "text/")), r.headers
    if r.status_code in (401, 403):
        body = r.json()
        assert body["status"] == "error" and body["error"], body
        assert ADMIN not in r.text and ENQ not in r.text and READ not in r.text
    return r.status_code


@pytest.mark.timeout(60)
def test_scopes_allow_their_routes_only(guarded, sink):
    n = guarded
    task = {"url": f"{sink.url}/w", "countdown": 30}
    # no token, a wrong one, another scheme: 401 with a challenge
    for headers in ({}, bearer("x" * 32), {"Authorization": f"Basic {ADMIN}"},
                    {"Authorization": "Bearer"}, {"Authorization": f"Bearer {ADMIN}x"}):
        r = n.post("/queue", json=task, headers=headers, timeout=10)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers.get("WWW-Authenticate", "").startswith("Bearer")
    for path in ("/queues", "/metrics", "/cluster", "/tasks/abc", "/tasks?name=x"):
        assert status(n, "GET", path, None) == 401, path
    # probes are open, and so is the dashboard's page (no data: its script asks for a token)
    for path in ("/healthz", "/readyz", "/", "/dashboard/dashboard.js"):
        assert status(n, "GET", path, None) == 200, path

    # enqueue: enqueue and read its task, nothing else
    r = n.post("/queue", json=task, headers=bearer(ENQ), timeout=10)
    assert r.status_code == 200, r.text
    tid = r.json()["id"]
    assert status(n, "GET", f"/tasks/{tid}", ENQ) == 200
    for method, path in (("GET", "/queues"), ("GET", "/metrics"), ("DELETE", f"/tasks/{tid}"),
                         ("POST", "/queues/default/pause"), ("POST", f"/tasks/{tid}/retry")):
        assert status(n, method, path, ENQ) == 403, (method, path)

    # read: every GET, no change
    for path in ("/queues", "/queues/default", "/queues/default/tasks", "/metrics", "/cluster",
                 f"/tasks/{tid}", "/openapi.json", "/"):
        assert status(n, "GET", path, READ) == 200, path
    assert status(n, "POST", "/queue", READ, json=task) == 403
    for method, path in (("DELETE", f"/tasks/{tid}"), ("POST", "/queues/default/purge")):
        assert status(n, method, path, READ) == 403, (method, path)
    assert n.get(f"/tasks/{tid}", headers=bearer(READ)).json()["state"] == "scheduled"

    # admin: everything
    assert status(n, "POST", "/queues/default/pause", ADMIN) == 200
    assert status(n, "POST", "/queues/default/resume", ADMIN) == 200
    assert status(n, "DELETE", f"/tasks/{tid}", ADMIN) == 200
    assert n.get(f"/tasks/{tid}", headers=bearer(READ)).json()["state"] == "cancelled"
    assert status(n, "POST", "/queue", ADMIN, json={"url": f"{sink.url}/now"}) == 200
    sink.wait_for(count=1, path="/now", timeout=10)

    text = n.log_text()
    assert all(t not in text for t in (ADMIN, ENQ, READ)), "a token reached the log"
    assert "Traceback" not in text


@pytest.mark.timeout(60)
def test_the_cli_sends_its_token(guarded, sink):
    env = {"MIYAMOTO_SERVER": guarded.url}
    cp = run_cli("enqueue", f"{sink.url}/cli", "a=1", env=env)
    assert cp.returncode == 1 and "Bearer" in cp.stderr, cp.stdout + cp.stderr
    cp = run_cli("enqueue", f"{sink.url}/cli", "a=1", f"--token={ENQ}", env=env)  # may start with -
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = run_cli("status", env=dict(env, MIYAMOTO_API_TOKEN=READ))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    (req,) = sink.wait_for(count=1, path="/cli", timeout=10)
    assert req.form == {"a": ["1"]} or req.form.get("a") in ("1", ["1"]), req.form


@pytest.mark.timeout(30)
def test_beyond_loopback_needs_tokens(node_factory):
    n = node_factory("exposed", extra_args=["--http", f"0.0.0.0:{free_port()}"], ready=False)
    assert n.wait_exit(15) == 2
    assert "api_tokens" in n.log_text() and "insecure_http" in n.log_text()
    # unit level, the other addresses and the ways out
    for http in ("0.0.0.0:1", "[::]:1", "10.1.2.3:1", "example.com:1"):
        with pytest.raises(config.ConfigError, match="api_tokens"):
            config.load(env={}, flags={"http": http})
        config.load(env={}, flags={"http": http, "insecure_http": "true"})
        config.load(env={"MIYAMOTO_API_TOKENS": TOKENS}, flags={"http": http})
    for http in ("127.0.0.1:1", "127.9.9.9:1", "[::1]:1", "localhost:1"):
        config.load(env={}, flags={"http": http})


def test_token_values_are_checked_and_never_echoed():
    for bad in ("admin", "root:" + "x" * 20, "admin:short", "admin:" + "x" * 20 + " y"):
        with pytest.raises(config.ConfigError) as e:
            config.load(env={"MIYAMOTO_API_TOKENS": bad})
        assert str(e.value).startswith("api_tokens:")
        assert "x" * 20 not in str(e.value)
    c = config.load(env={"MIYAMOTO_API_TOKENS": TOKENS})
    assert c.redacted()["api_tokens"] == "***"
    t = auth.Tokens(c.api_tokens)
    assert t.scope_of(f"Bearer {ADMIN}") == "admin" and t.scope_of(f"bearer  {READ} ") == "read"
    assert t.scope_of(f"Bearer {ADMIN[:-1]}") is None and t.scope_of(None) is None
    with pytest.raises(auth.Denied) as d:
        t.check(f"Bearer {READ}", auth.ADMIN)
    assert d.value.status == 403 and READ not in d.value.message
    auth.Tokens(()).check(None, auth.ADMIN)  # no tokens: open
