"""A one-page HTML view of the node: cluster, queues, counts (GET /)."""

from __future__ import annotations

from html import escape
from typing import Any

from miyamoto.version import __version__


def render(service: Any) -> str:
    info = service.cluster_info()
    queues = service.queues()
    members = "".join(
        f"<tr><td>{escape(str(m.get('id')))}</td><td>{escape(str(m.get('http')))}</td>"
        f"<td>{escape(str(m.get('cluster')))}</td>"
        f"<td>{'leader' if m.get('id') == info.get('leader') else ''}</td>"
        f"<td>{escape(_last_heard(m, info.get('node')))}</td></tr>"
        for m in info.get("members", []))
    states = ("scheduled", "running", "succeeded", "failed", "cancelled")
    rows = "".join(
        f"<tr><td>{escape(q['name'])}</td><td>{'paused' if q['paused'] else 'running'}</td>"
        + "".join(f"<td>{q['counts'].get(s, 0)}</td>" for s in states) + "</tr>"
        for q in queues)
    head = "".join(f"<th>{s}</th>" for s in states)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Miyamoto {escape(str(info.get('node')))}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:left}}</style></head>
<body><h1>Miyamoto {__version__}: node {escape(str(info.get('node')))}</h1>
<h2>Cluster</h2><p>leader {escape(str(info.get('leader')))}, term {escape(str(info.get('term')))}</p>
<table><tr><th>id</th><th>http</th><th>cluster</th><th>role</th><th>last heard</th></tr>{members}</table>
<h2>Queues</h2><table><tr><th>queue</th><th>state</th>{head}</tr>{rows}</table>
<p><a href="/openapi.json">openapi.json</a> · <a href="/metrics">metrics</a></p>
</body></html>"""


def _last_heard(member: dict[str, Any], me: Any) -> str:
    """The member's ``last_heard`` (seconds since this node last heard from it, as
    GET /cluster serves it) for a reader: "this node", "2.5 s ago", or "-" when this
    node has not heard from it (a follower hears only from the leader)."""
    if member.get("id") == me:
        return "this node"
    seconds = member.get("last_heard")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "-"
    return f"{float(seconds):.1f} s ago" if seconds < 60 else f"{float(seconds):.0f} s ago"
