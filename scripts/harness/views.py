"""What a node says about itself: GET /cluster, /metrics, and waits on those answers.

``http_get_json`` is a probe on a fresh stdlib connection to 127.0.0.1 (None on any
failure), usable with or without gevent's monkey-patching and never through a proxy.
"""

from __future__ import annotations

import http.client
import json
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from .nodes import NodeProcess
from .waits import LOCAL_HOSTS, LOCALHOST, HarnessError, NodeDied, wait_until


def http_get(url: str, timeout: float = 2.0) -> bytes | None:
    """GET from 127.0.0.1 (or a harness namespace) on a fresh connection (None on any failure or non-200)."""
    parts = urlsplit(url)
    if parts.hostname not in LOCAL_HOSTS:
        raise ValueError(f"the harness only talks to {LOCALHOST} and its own namespaces: {url}")
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        resp = conn.getresponse()
        body = resp.read()
        return body if resp.status == 200 else None
    except (OSError, http.client.HTTPException):  # a probe: any failure means "not there"
        return None
    finally:
        conn.close()


def http_get_json(url: str, timeout: float = 2.0) -> Any:
    """GET a JSON document from 127.0.0.1 (None on any failure, non-200 or bad JSON)."""
    body = http_get(url, timeout)
    if body is None:
        return None
    try:
        return json.loads(body) if body else {}
    except ValueError:
        return None


def cluster_view(node: NodeProcess, timeout: float = 2.0) -> dict[str, Any]:
    """GET /cluster on ``node`` (asserting 200)."""
    r = node.get("/cluster", timeout=timeout)
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def probe_view(node: NodeProcess, timeout: float = 2.0) -> dict[str, Any] | None:
    """GET /cluster on ``node``, or None when it does not answer."""
    view = http_get_json(node.url + "/cluster", timeout)
    return view if isinstance(view, dict) else None


def member_ids(view: Mapping[str, Any]) -> list[str]:
    return sorted(m["id"] for m in view.get("members", []))


def wait_converged(nodes: Sequence[NodeProcess], timeout: float = 15.0,
                   expect: Iterable[str] | None = None) -> dict[str, Any]:
    """Wait until every node's GET /cluster names the same leader (one of them), the same
    term and the same members: the ids of ``nodes`` (or ``expect``). Returns one view."""
    want = sorted(expect) if expect is not None else sorted(n.node_id for n in nodes)
    last: dict[str, Any] = {}

    def agreed() -> dict[str, Any] | None:
        views = {}
        for n in nodes:
            if not n.running:
                raise NodeDied(f"node {n.node_id} exited with {n.returncode}:\n{n.log_text(60)}")
            views[n.node_id] = cluster_view(n)
        last.clear()
        last.update({k: (v.get("leader"), v.get("term"), v.get("version"), member_ids(v))
                     for k, v in views.items()})
        first = next(iter(views.values()))
        if first.get("leader") not in want:
            return None
        for v in views.values():
            if (v.get("leader"), v.get("term"), member_ids(v)) != \
                    (first.get("leader"), first.get("term"), want):
                return None
        return first

    try:
        return wait_until(agreed, timeout, interval=0.05, what=f"cluster {want} to agree")
    except NodeDied:
        raise
    except AssertionError as e:
        raise HarnessError(f"{e}; last seen (leader, term, version, members): {last}") from None


def is_counter(key: str) -> bool:
    """A ``metrics`` key that only grows (a counter, or a histogram's count and sum)."""
    return key.partition("{")[0].endswith(("_total", "_count", "_sum"))


def parse_metrics(text: str) -> dict[str, float]:
    """The ``miyamoto_*`` samples of a /metrics body (prefix removed), read by
    prometheus_client's parser. An unlabelled sample is ``name``; a labelled one is
    ``name{label="value",...}`` (labels sorted), and ``name`` alone is then the sum
    over its label sets (attempts of every queue and outcome). Histogram buckets are
    left out (their ``_count`` and ``_sum`` stay)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    summed: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("miyamoto_") or "le" in sample.labels:
                continue
            name = sample.name.removeprefix("miyamoto_")
            if not sample.labels:
                out[name] = float(sample.value)
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{name}{{{labels}}}"] = float(sample.value)
            summed[name] = summed.get(name, 0.0) + float(sample.value)
    for name, total in summed.items():
        out.setdefault(name, total)
    return out


def metrics(node: NodeProcess, timeout: float = 2.0) -> dict[str, float] | None:
    """``parse_metrics`` of a node's /metrics, or None if it did not answer."""
    body = http_get(node.url + "/metrics", timeout)
    if body is None:
        return None
    try:
        return parse_metrics(body.decode("utf-8", "replace"))
    except ValueError:
        return None


def server_metrics(nodes: Sequence[NodeProcess]) -> dict[str, float]:
    """``metrics`` of every node summed (``cluster_*`` gauges, one value per cluster, as
    their maximum)."""
    totals: dict[str, float] = {}
    for node in nodes:
        for key, number in (metrics(node) or {}).items():
            if key.startswith("cluster_") and not is_counter(key):
                totals[key] = max(totals.get(key, number), number)
            else:
                totals[key] = totals.get(key, 0.0) + number
    return {k: int(v) if v.is_integer() else v for k, v in sorted(totals.items())}
