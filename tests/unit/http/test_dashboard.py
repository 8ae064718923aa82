"""The dashboard's Python side, in-process: the page and its assets (types, CSP, only
the known files, open with API tokens on while the data routes stay guarded), the
name lookup route, and the per-queue totals the page computes its rates from.

The page itself runs in a real browser in tests/nodes/test_dashboard_browser.py, the
lookup and the totals against real nodes in tests/nodes/test_dashboard_node.py."""

from __future__ import annotations

import fnmatch
import io
import re
import secrets
from html.parser import HTMLParser
from types import SimpleNamespace
from typing import Any

import pytest
import ujson

from helpers import REPO
from miyamoto.http import auth
from miyamoto.http import dashboard
from miyamoto.http.api import Api
from miyamoto.engine.engine import Stats
from miyamoto.cluster.queries import COPIES_PREFIX, IDS_FLAG, TOTAL_PREFIX, Queries
from miyamoto.tasks.validate import Limits

pytestmark = pytest.mark.timeout(30)

ADMIN, ENQ, READ = (secrets.token_urlsafe(24) for _ in range(3))
ROOT = REPO


class Service:
    """What the routes under test ask of the node; records the name lookups."""

    def __init__(self) -> None:
        self.lookups: list[tuple[str, str]] = []

    def find_task(self, queue: str, name: str) -> dict[str, Any] | None:
        self.lookups.append((queue, name))
        return {"id": "t-1", "queue": queue, "name": name} if name == "known" else None

    def queues(self, limit: int, cursor: str) -> dict[str, Any]:
        return {"queues": [], "next_cursor": None}


def call(app: Api, path: str, method: str = "GET", query: str = "",
         token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list) -> None:
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
               "wsgi.input": io.BytesIO(b"")}
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


@pytest.fixture(params=["open", "tokens"])
def app(request: pytest.FixtureRequest) -> Api:
    tokens = auth.Tokens([("admin", ADMIN), ("enqueue", ENQ), ("read", READ)]) \
        if request.param == "tokens" else None
    return Api(Service(), Limits(), max_batch=10, tokens=tokens)


@pytest.fixture
def guarded() -> Api:
    return Api(Service(), Limits(), max_batch=10,
               tokens=auth.Tokens([("admin", ADMIN), ("enqueue", ENQ), ("read", READ)]))


# ================================================================ page and assets

@pytest.mark.parametrize("path,ctype", [
    ("/", "text/html; charset=utf-8"),
    ("/dashboard/dashboard.html", "text/html; charset=utf-8"),
    ("/dashboard/dashboard.js", "text/javascript; charset=utf-8"),
    ("/dashboard/dashboard.css", "text/css; charset=utf-8"),
])
def test_page_and_assets_load_without_a_token(app: Api, path: str, ctype: str) -> None:
    status, headers, body = call(app, path)
    assert status == 200 and headers["Content-Type"] == ctype and body
    assert headers["Content-Length"] == str(len(body))
    assert headers["X-Content-Type-Options"] == "nosniff"
    csp = headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in csp
    head_status, head_headers, head_body = call(app, path, method="HEAD")
    assert head_status == 200 and head_body == b"" and "Content-Security-Policy" in head_headers


@pytest.mark.parametrize("path", [
    "/dashboard/", "/dashboard/api.py", "/dashboard/../api.py", "/dashboard/..%2fapi.py",
    "/dashboard/..", "/dashboard/static/dashboard.js", "/dashboard/dashboard.js/x",
    "/dashboard/DASHBOARD.JS", "/dashboard/dashboard.js%00", "/dashboard//etc/passwd",
    "/static/dashboard.js", "/dashboard/__init__.py",
])
def test_only_the_known_files_are_served(app: Api, path: str) -> None:
    status, headers, body = call(app, path)
    assert status == 404 and headers["Content-Type"] == "application/json"
    assert ujson.loads(body)["status"] == "error"
    assert b"import" not in body and b"root:" not in body


def test_the_data_routes_keep_their_scopes(guarded: Api) -> None:
    assert call(guarded, "/queues")[0] == 401
    assert call(guarded, "/queues", token="not-a-token-at-all-x")[0] == 401
    assert call(guarded, "/queues", token=READ)[0] == 200
    # only the page's own routes are open: a name lookup needs read
    assert call(guarded, "/tasks", query="name=known")[0] == 401
    assert call(guarded, "/tasks", query="name=known", token=ENQ)[0] == 403
    assert call(guarded, "/tasks", query="name=known", token=READ)[0] == 200


def test_the_page_holds_no_inline_script_style_or_handler() -> None:
    """The CSP would block them; the page must not need them."""

    class Check(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.scripts: list[dict] = []
            self.bad: list[str] = []
            self.tag = ""

        def handle_starttag(self, tag: str, attrs: list) -> None:
            self.tag = tag
            a = dict(attrs)
            if tag == "script":
                self.scripts.append(a)
            if tag == "style":
                self.bad.append("<style>")
            self.bad += [f"{tag} {k}" for k in a if k.startswith("on") or k == "style"]
            if any(str(v).strip().lower().startswith("javascript:") for v in a.values()):
                self.bad.append(f"{tag} javascript: URL")

        def handle_data(self, data: str) -> None:
            if self.tag == "script" and data.strip():
                self.bad.append("inline script")

    page = dashboard.asset(dashboard.PAGE)
    assert page is not None
    check = Check()
    check.feed(page[0].decode())
    assert check.bad == []
    assert [s.get("src") for s in check.scripts] == ["/dashboard/dashboard.js"]


def test_the_script_never_writes_html() -> None:
    """Data goes on the page as text only (a task's last response is a stranger's bytes)."""
    js = dashboard.asset("dashboard.js")[0].decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "javascript:"):
        assert sink not in js, sink
    # every path the script asks for is one of the API's routes (no other host)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", js)


def test_every_served_file_is_package_data() -> None:
    """An installed wheel has the files: setup.py's package_data covers each one."""
    setup = (ROOT / "setup.py").read_text()
    globs = re.search(r'package_data=\{"miyamoto\.http": \[([^\]]*)\]', setup).group(1)
    patterns = re.findall(r'"([^"]+)"', globs)
    for name in dashboard.FILES:
        assert any(fnmatch.fnmatch(f"static/{name}", p) for p in patterns), name
        assert (ROOT / "miyamoto" / "http" / "static" / name).is_file()


# ================================================================ name lookup

def test_name_lookup_route(app: Api) -> None:
    token = READ if app.tokens.enabled else None
    status, _, body = call(app, "/tasks", query="name=known&queue=mail", token=token)
    assert status == 200 and ujson.loads(body)["id"] == "t-1"
    assert call(app, "/tasks", query="name=known", token=token)[0] == 200  # queue: default
    assert call(app, "/tasks/", query="name=known", token=token)[0] == 404  # /tasks/ is no route
    assert app.service.lookups == [("mail", "known"), ("default", "known")]
    status, _, body = call(app, "/tasks", query="name=nobody", token=token)
    assert status == 404 and ujson.loads(body)["field"] == "name"
    for query, field in [("name=", "name"), ("name=" + "x" * 501, "name"),
                         ("name=a&queue=b%2Fad", "queue"), ("name=a&queue=", "queue")]:
        status, _, body = call(app, "/tasks", query=query, token=token)
        assert status == 400 and ujson.loads(body)["field"] == field, query


class StubEngine:
    def __init__(self) -> None:
        self.stats = Stats()
        self.dispatcher = SimpleNamespace(targets=lambda: [])
        self.names: dict[tuple[str, str], tuple[str, float]] = {("q", "mine"): ("id-1", 1e12),
                                                                ("q", "old"): ("id-0", 1.0)}

    def clock(self) -> float:
        return 1000.0

    def name_holder(self, queue: str, name: str) -> tuple[str, float] | None:
        return self.names.get((queue, name))  # (the engine's: memory, else the journal)

    def queue_counts(self, primary_only: bool = False) -> dict[str, dict[str, int]]:
        return {"q": {"succeeded": 2 if primary_only else 4}}

    def copy_states(self, limit: int) -> None:
        return None  # more copies than a node sends the ids of: the counts add up


class StubRequests:
    def __init__(self, answers: dict[str, Any]):
        self.answers = answers
        self.asked: list[tuple[str, dict]] = []

    def ask_all(self, members: list[str], op: str, args: dict, timeout: float) -> dict:
        self.asked.append((op, args))
        return self.answers.get(op, {})


class StubPeers:
    """The cluster layer as the queries see it: two other members."""

    def others(self) -> list[str]:
        return ["b", "c"]

    def replay(self, task_id: str) -> None:
        pass


def queries(answers: dict[str, Any]) -> Queries:
    return Queries("a", StubEngine(), StubRequests(answers), StubPeers(),  # type: ignore[arg-type]
                   timeout=1.0, offset=1.0, clock=lambda: 1000.0)


def test_find_name_asks_the_peers_only_when_this_node_does_not_hold_it() -> None:
    q = queries({"name": {"b": "id-2", "c": None}})
    assert q.find_name("q", "mine") == "id-1" and q.requests.asked == []
    assert q.find_name("q", "theirs") == "id-2"
    assert q.requests.asked == [("name", {"queue": "q", "name": "theirs"})]
    assert queries({"name": {"b": None, "c": 7}}).find_name("q", "x") is None  # ill-typed
    assert q.serve("name", {"queue": "q", "name": "mine"}) == "id-1"
    assert q.serve("name", {"queue": "q", "name": "other"}) is None
    assert q.serve("name", {"queue": "q", "name": "old"}) is None  # its reservation expired


def test_totals_count_per_queue_and_add_up_over_the_cluster() -> None:
    s = Stats()
    for what in ("enqueued", "enqueued", "delivered", "failed"):
        s.count("q", what, 1000.0)
    s.count("r", "enqueued", 1000.0)
    assert s.totals == {"q": {"enqueued": 2, "delivered": 1, "failed": 1},
                        "r": {"enqueued": 1, "delivered": 0, "failed": 0}}
    peer = {"q": {"succeeded": 1, TOTAL_PREFIX + "enqueued": 5, TOTAL_PREFIX + "delivered": 4},
            "z": {TOTAL_PREFIX + "failed": "x"}}  # an ill-typed value is left out
    q = queries({"counts": {"b": peer}})
    q.engine.stats = s
    local = q.counts_local()
    assert local["q"] == {"succeeded": 2, COPIES_PREFIX + "succeeded": 4,
                          TOTAL_PREFIX + "enqueued": 2, TOTAL_PREFIX + "delivered": 1,
                          TOTAL_PREFIX + "failed": 1}
    assert local[IDS_FLAG] is False
    assert q.serve("counts", {}) == local
    merged = q.queue_counts()
    assert merged["q"] == {"succeeded": 3, COPIES_PREFIX + "succeeded": 4,
                           TOTAL_PREFIX + "enqueued": 7, TOTAL_PREFIX + "delivered": 5,
                           TOTAL_PREFIX + "failed": 1}
    assert merged["z"] == {}
