"""The dashboard in a real headless browser (Debian's chromium driven by playwright)
against a real node and a real sink: the roster, a paused queue, a failed task with its
attempts and last response (shown as text, never as HTML), retry and resume clicked and
seen delivered, purge behind a confirmation, and the token form with API tokens on.

Without /usr/bin/chromium the tests skip, except in CI (env CI set), where .ci/run
installs it and its absence is a failure. A screenshot of each page is written to
$MIYAMOTO_ARTIFACTS (else tests/artifacts/) and its path printed.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from helpers import NodeProcess, Reply, Sink, free_port, wait_until

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 20_000  # generous: the box is shared
ADMIN, READ = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
# a stranger's bytes as the last response: shown as text, never parsed as HTML
EVIL = '<img src=x onerror="document.title=\'pwned\'"><b id="evil">bold</b>'


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why}: in CI, .ci/run must install chromium and playwright")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        _unavailable(f"no {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    with tempfile.TemporaryDirectory(prefix="miyamoto-chromium-") as profile, \
            sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=ARGS,
            viewport={"width": 1280, "height": 1000})
        ctx.set_default_timeout(WAIT_MS)
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    pg = browser.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    pg.close()
    assert errors == [], errors  # the script threw


def screenshot(page: Any, name: str) -> Path:
    base = Path(os.environ.get("MIYAMOTO_ARTIFACTS") or Path(__file__).resolve().parents[1] / "artifacts")
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"dashboard screenshot: {path}")
    return path


def text(page: Any, selector: str) -> str:
    return page.locator(selector).inner_text()


def wait_count(page: Any, selector: str, n: int) -> None:
    """Until exactly ``n`` elements match (a new page of rows replaces the old one)."""
    from playwright.sync_api import expect

    expect(page.locator(selector)).to_have_count(n, timeout=WAIT_MS)


def wait_text(page: Any, selector: str, expected: str) -> None:
    """Until the element's text contains ``expected`` (the page refreshes every 2 s)."""
    from playwright.sync_api import expect

    expect(page.locator(selector)).to_contain_text(expected, timeout=WAIT_MS)


@pytest.mark.timeout(90)
def test_dashboard_retries_a_failed_task_and_resumes_a_queue(
        node_factory: Callable[..., NodeProcess], sink: Sink, page: Any) -> None:
    node = node_factory(queues={"held": {}, "junk": {}})  # a pause creates no queue
    sink.reply("/fail", Reply(500, body=EVIL))
    failed = node.enqueue(url=sink.url_for("/fail"), max_attempts=1, name="nightly-report")["id"]
    node.wait_task_state(failed, "failed", timeout=15)
    assert node.post("/queues/held/pause").status_code == 200
    held = [node.enqueue("held", url=sink.url_for("/held"))["id"] for _ in range(2)]
    assert node.post("/queues/junk/pause").status_code == 200
    node.enqueue("junk", url=sink.url_for("/junk"))

    page.goto(node.url + "/")
    me = f'#cluster-table tr[data-member="{node.node_id}"]'
    wait_text(page, me, "this node")
    assert "leader" in text(page, me)
    assert "term" in text(page, "#cluster-summary")
    wait_text(page, 'tr[data-queue="held"] td:nth-child(2)', "paused")
    assert text(page, 'tr[data-queue="held"] .count-scheduled') == "2"
    row = f'#failed-panel tr[data-task="{failed}"]'
    wait_text(page, row, "nightly-report")
    assert text(page, f"{row} .attempts") == "1"
    assert "HTTP 500" in text(page, f"{row} .last-response")
    assert page.locator(f"{row} pre.body").text_content() == EVIL  # as text, byte for byte
    assert page.locator("#evil").count() == 0 and page.title() != "pwned"
    screenshot(page, "dashboard")

    # the target is fixed: retry from the failed list, see it delivered and succeeded
    sink.reply("/fail", 200)
    page.locator(f"{row} button.retry").click()
    sink.wait_for(lambda reqs: len([r for r in reqs if r.path == "/fail"]) >= 2, timeout=15)
    wait_text(page, "#task-detail .task-state", "succeeded")
    wait_text(page, "#task-detail", failed)
    page.locator(row).wait_for(state="detached")
    assert page.locator("#failed-none").is_visible()

    # resume the paused queue: its tasks are delivered, the row says running
    page.locator('tr[data-queue="held"] button.resume').click()
    sink.wait_for(lambda reqs: len([r for r in reqs if r.path == "/held"]) >= 2, timeout=15)
    assert {r.task_id for r in sink.requests("/held")} == set(held)
    wait_text(page, 'tr[data-queue="held"] td:nth-child(2)', "running")
    wait_text(page, 'tr[data-queue="held"] .count-succeeded', "2")
    # the rates came from successive totals: the deliveries were seen in a sample
    page.wait_for_function("() => ui.rates.some((r) => r.delivered > 0)", timeout=WAIT_MS)
    totals = {q["name"]: q["totals"] for q in node.get("/queues").json()["queues"]}
    assert totals["held"] == {"enqueued": 2, "delivered": 2, "failed": 0}
    assert totals["default"] == {"enqueued": 1, "delivered": 1, "failed": 1}

    # purge asks first: dismissed, nothing happens; accepted, the task is cancelled
    answers = iter([False, True])
    page.on("dialog", lambda d: d.accept() if next(answers) else d.dismiss())
    purge = page.locator('tr[data-queue="junk"] button.purge')
    purge.click()
    wait_text(page, "#refreshed", "refreshed")
    assert node.counts("junk")["scheduled"] == 1
    purge.click()
    wait_until(lambda: node.counts("junk")["cancelled"] == 1, 15, what="junk purged")
    wait_text(page, "#message", "1 tasks purged")

    # lookup by name, then by id
    page.fill("#lookup-key", "nightly-report")
    page.click('#lookup-form button[type="submit"]')
    wait_text(page, "#task-detail .field-name", "nightly-report")
    assert text(page, "#task-detail .field-id") == failed
    page.fill("#lookup-key", held[0])
    page.fill("#lookup-queue", "held")
    page.click('#lookup-form button[type="submit"]')
    wait_text(page, "#task-detail .field-id", held[0])
    page.fill("#lookup-key", "no-such-task")
    page.click('#lookup-form button[type="submit"]')
    wait_text(page, "#lookup-message", "No task has the id no-such-task")
    # the node answers /targets: the panel lists the sink's origin (its breaker closed,
    # one failed attempt behind it that the retry's success reset)
    origin = sink.url
    wait_text(page, f'#targets-table tr[data-origin="{origin}"]', "closed")
    assert page.locator("#schedules-panel").is_visible()  # (no schedule yet: an empty table)
    screenshot(page, "dashboard-after")


@pytest.mark.timeout(60)
def test_dashboard_asks_for_a_token(node_factory: Callable[..., NodeProcess],
                                    page: Any) -> None:
    node = node_factory(env={"MIYAMOTO_API_TOKENS": f"admin:{ADMIN},read:{READ}"})
    page.goto(node.url + "/")
    wait_text(page, "#token-why", "needs an API token (401")
    assert not page.locator("#cluster-panel").is_visible()

    page.fill("#token-input", "wrong-" + secrets.token_urlsafe(16))
    page.click('#token-form button[type="submit"]')
    wait_text(page, "#token-why", "The token was refused (401")
    assert not page.locator("#cluster-panel").is_visible()

    page.fill("#token-input", READ)
    page.click('#token-form button[type="submit"]')
    wait_text(page, f'#cluster-table tr[data-member="{node.node_id}"]', "this node")
    assert not page.locator("#token-panel").is_visible()
    assert page.evaluate("() => sessionStorage.getItem('miyamoto.token')") == READ

    # a read token may not pause: a clear 403, and the form asks again
    page.locator('tr[data-queue="default"] button.pause').click()
    wait_text(page, "#token-why", "may not do that (403")
    assert page.locator("#token-panel").is_visible()
    assert node.get("/queues/default", headers={"Authorization": f"Bearer {READ}"}
                    ).json()["paused"] is False
    page.fill("#token-input", ADMIN)
    page.click('#token-form button[type="submit"]')
    page.locator('tr[data-queue="default"] button.pause').click()
    wait_text(page, 'tr[data-queue="default"] td:nth-child(2)', "paused")
    body = page.locator("body").inner_text()
    assert ADMIN not in body and READ not in body  # never shown
    # auto-refresh can be paused and resumed
    page.click("#refresh-toggle")
    wait_text(page, "#refresh-toggle", "Resume refresh")
    page.wait_for_function("() => !ui.auto && ui.timer === null", timeout=WAIT_MS)
    page.click("#refresh-toggle")
    page.wait_for_function("() => ui.auto && ui.timer !== null", timeout=WAIT_MS)
    screenshot(page, "dashboard-token")


SERIES_SUM = "() => ui.series && ui.series.seconds === {0} && " \
    "ui.series.delivered.reduce((a, b) => a + b, 0) >= {1}"
BACKGROUND = "() => getComputedStyle(document.body).backgroundColor"


@pytest.mark.timeout(120)
def test_console_an_operator_keeps_open(node_factory: Callable[..., NodeProcess], sink: Sink,
                                        page: Any, tmp_path: Path) -> None:
    """With tokens on: the rate chart from the node's history on load (and after a
    reload), 5 min and 1 h; latency and open breakers by queue; browsing scheduled
    tasks by name prefix and target; a task's params and headers with the secrets
    redacted, and why it waits; the footer links answering 200 with the token; then
    dark mode at phone width with no horizontal scroll. Screenshots at 1280 and 390 px."""
    node = node_factory(options={"breaker_failures": 2, "breaker_cooldown": 60},
                        env={"MIYAMOTO_API_TOKENS": f"admin:{ADMIN},read:{READ}"})
    node.session.headers["Authorization"] = f"Bearer {ADMIN}"
    sink.reply("/ok", 200)
    for i in range(6):
        node.enqueue("mail", url=sink.url_for("/ok"), params={"n": str(i)})
    secret = node.enqueue("mail", url=sink.url_for("/later"), countdown=600, name="invoice-42",
                          params={"customer": "c-7"}, labels={"team": "billing"},
                          headers={"Authorization": "Bearer tgt-secret", "X-Signature": "sig-9",
                                   "X-Trace": "trace-1"})["id"]
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: its breaker opens
    stuck = [node.enqueue("hooks", url=f"{down}/hook", max_attempts=20)["id"] for _ in range(2)]
    wait_until(lambda: node.get("/queues/hooks").json()["breakers"], 20, what="breaker open")
    sink.wait_for(lambda reqs: len([r for r in reqs if r.path == "/ok"]) >= 6, timeout=15)

    page.goto(node.url + "/")
    page.fill("#token-input", READ)
    page.click('#token-form button[type="submit"]')
    wait_text(page, 'tr[data-queue="mail"] .latency', "ms")
    wait_text(page, 'tr[data-queue="hooks"] .breakers', f"breaker open: {down}")
    # the chart reads the node's per-second history, on load and after a reload
    page.wait_for_function(SERIES_SUM.format(300, 6), timeout=WAIT_MS)
    page.reload()
    page.wait_for_function(SERIES_SUM.format(300, 6), timeout=WAIT_MS)
    assert page.locator("#chart polyline.delivered").count() == 1
    page.click('button.range[data-seconds="3600"]')
    page.wait_for_function(SERIES_SUM.format(3600, 6), timeout=WAIT_MS)
    wait_text(page, "#chart-title", "last hour")
    page.select_option("#chart-node", node.node_id)  # one node's own counts
    page.wait_for_function(f"() => ui.series && ui.series.nodes.join() === '{node.node_id}'"
                           " && ui.series.seconds === 3600", timeout=WAIT_MS)
    wait_text(page, "#chart-nodes", f"(node {node.node_id})")

    # browse: scheduled tasks by name prefix, then by target; the task view
    page.fill("#browse-name", "invoice")
    page.click('#browse-form button[type="submit"]')
    wait_text(page, f'#browse-table tr[data-task="{secret}"]', "invoice-42")
    wait_count(page, "#browse-table tbody tr", 1)  # the filtered page, not the one before
    page.locator(f'#browse-table tr[data-task="{secret}"] a').click()
    wait_text(page, "#task-detail .field-params", "c-7")
    headers = text(page, "#task-detail .field-headers")
    assert "trace-1" in headers and headers.count("[redacted]") == 2, headers
    assert "tgt-secret" not in page.content() and "sig-9" not in page.content()
    wait_text(page, "#task-detail .field-labels", "billing")
    page.fill("#browse-name", "")
    page.fill("#browse-label", "team=nobody")  # the label box filters: none has it
    page.click('#browse-form button[type="submit"]')
    wait_count(page, "#browse-table tbody tr", 0)
    page.fill("#browse-label", "team=billing")
    page.click('#browse-form button[type="submit"]')
    wait_text(page, f'#browse-table tr[data-task="{secret}"]', "invoice-42")
    wait_count(page, "#browse-table tbody tr", 1)
    page.fill("#browse-label", "")
    page.fill("#browse-target", down)
    page.click('#browse-form button[type="submit"]')
    wait_text(page, f'#browse-table tr[data-task="{stuck[0]}"]', "hooks")
    wait_count(page, "#browse-table tbody tr", 2)
    page.locator(f'#browse-table tr[data-task="{stuck[0]}"] a').click()
    wait_text(page, "#task-detail .field-state .why", "circuit breaker")
    screenshot(page, "console-1280-light")
    assert page.evaluate(BACKGROUND) == "rgb(255, 255, 255)"

    # the footer links, with the token: shown in the page, answered 200
    for link, expect in (("metrics", "miyamoto_"), ("openapi.json", '"openapi"')):
        page.click(f'footer a:text-is("{link}")')
        wait_text(page, "#raw-title", f"/{link}: HTTP 200")
        assert expect in text(page, "#raw-body")

    # a phone, in dark mode: nothing wider than the screen
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_function("() => document.documentElement.scrollWidth <= 390",
                           timeout=WAIT_MS)
    assert page.evaluate(BACKGROUND) == "rgb(22, 24, 28)"
    screenshot(page, "console-390-dark")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390


def fulfill(body: Any) -> Callable[..., None]:
    """A playwright route handler answering ``body`` as JSON."""
    def handle(route: Any, request: Any = None) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))
    return handle


@pytest.mark.timeout(60)
def test_dashboard_shows_last_heard_targets_and_schedules(node: NodeProcess, page: Any) -> None:
    """The roster's "last heard" column, from a /cluster answer of four members (a
    single node hears only itself), and the targets and schedules panels from answers
    in the shapes those routes promise (this node serves neither)."""
    answer = {"node": "a", "role": "leader", "leader": "a", "term": 4, "version": 9,
              "members": [
                  {"id": "a", "http": "127.0.0.1:1", "cluster": "x", "leader": True,
                   "last_heard": 0.0},
                  {"id": "b", "http": "127.0.0.1:3", "cluster": "x", "leader": False,
                   "last_heard": 2.5},
                  {"id": "c", "http": "127.0.0.1:5", "cluster": "x", "leader": False,
                   "last_heard": None},
                  {"id": "d", "http": "127.0.0.1:7", "cluster": "x", "leader": False,
                   "last_heard": 754.2, "zone": "<b>z</b>"}],
              "down": [{"id": "e", "http": "127.0.0.1:9", "cluster": "x", "zone": None,
                        "down_since": 1.7e9, "last_heard_at": 1.7e9 - 3, "last_heard": 93.0},
                       {"id": "f", "http": "127.0.0.1:11", "cluster": "x", "zone": None,
                        "down_since": 1.7e9, "last_heard_at": None, "last_heard": None}]}
    targets = {"targets": [{"origin": "https://<i>slow</i>.example", "state": "open",
                            "failures": 7, "inflight": 0, "retry_at": 1.7e9}]}
    schedules = {"schedules": [
        {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris", "paused": False,
         "next": [1.7e9, 1.7e9 + 86400], "last_task_ids": ["t-1", "t-2"]},
        {"name": "tick", "every": 30, "timezone": "UTC", "paused": True, "next": [],
         "last_task_ids": []}]}
    for path, body in (("cluster", answer), ("targets", targets), ("schedules", schedules)):
        page.route(f"**/{path}", fulfill(body))
    page.goto(node.url + "/")
    heard = '#cluster-table tr[data-member="{}"] .last-heard'
    wait_text(page, heard.format("a"), "this node")
    assert text(page, heard.format("b")) == "2.5 s ago"
    assert text(page, heard.format("c")) == "-"
    assert text(page, heard.format("d")) == "754 s ago"
    assert "<b>z</b>" in text(page, '#cluster-table tr[data-member="d"]')
    assert "leader a, term 4" in text(page, "#cluster-summary")
    # members the roster dropped: down, with when they were last heard
    gone = '#cluster-table tr[data-member="{}"]'
    assert "down since" in text(page, gone.format("e"))
    assert text(page, gone.format("e") + " .last-heard") == "2 min ago"
    assert text(page, gone.format("f") + " .last-heard") == "never heard by this node"
    # the panels of routes other versions serve: shown when they answer 200
    wait_text(page, '#targets-panel tr[data-origin="https://<i>slow</i>.example"]', "open")
    assert "7" in text(page, "#targets-table tbody")
    assert page.locator("#targets-panel i").count() == 0
    wait_text(page, '#schedules-panel tr[data-schedule="nightly"]', "cron 0 3 * * *")
    assert "Europe/Paris" in text(page, '#schedules-panel tr[data-schedule="nightly"]')
    assert "t-2" in text(page, '#schedules-panel tr[data-schedule="nightly"]')
    tick = text(page, '#schedules-panel tr[data-schedule="tick"]')
    assert "every 30 s" in tick and "paused" in tick


RATES_JS = """() => {
  const realNow = Date.now;
  let t = 1.7e12;  // a fake clock (ms)
  Date.now = () => t;
  const q = (enqueued, delivered, failed) => [{name: "q", totals: {enqueued, delivered, failed}}];
  const seen = [];
  try {
    ui.base = null; ui.rates = []; ui.queueRates = {};
    sample(q(10, 5, 0));                   // the first read: nothing to compare with
    seen.push(queueRates("q"));
    t += 2000; sample(q(30, 9, 1));        // 20 enqueued, 4 delivered, 1 failed in 2 s
    seen.push(queueRates("q"));
    t += 100; sample(q(60, 60, 1));        // a click's refresh 0.1 s later: not a rate yet
    seen.push(queueRates("q"));
    t += 1900; sample(q(60, 60, 1));       // 2 s since the last rate: 30, 51, 0 in 2 s
    seen.push(queueRates("q"));
    t += 2000; sample(q(2, 1, 0));         // the node restarted: counts from 0, never < 0
    seen.push(queueRates("q"));
    t += 400000; sample(q(2, 1, 0));       // points older than the chart's 5 min are dropped
    return {seen, points: ui.rates.length};
  } finally {
    Date.now = realNow;
  }
}"""


@pytest.mark.timeout(60)
def test_rates_come_from_successive_totals(node: NodeProcess, page: Any) -> None:
    """The script's rate logic with a fake clock (its own refresh paused first)."""
    page.goto(node.url + "/")
    wait_text(page, "#refreshed", "refreshed")
    page.click("#refresh-toggle")
    page.wait_for_function("() => !ui.auto && ui.timer === null && !ui.busy", timeout=WAIT_MS)
    got = page.evaluate(RATES_JS)
    assert got["seen"] == [
        None,
        {"enqueued": 10, "delivered": 2, "failed": 0.5},
        {"enqueued": 10, "delivered": 2, "failed": 0.5},
        {"enqueued": 15, "delivered": 25.5, "failed": 0},
        {"enqueued": 0, "delivered": 0, "failed": 0},
    ], got
    assert got["points"] == 1
