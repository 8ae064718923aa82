"""Fan-out topics: a named list of URLs, one task per URL.

A topic is a cluster-wide definition (``miyamoto.definitions.machine``, kind "topic"). Each URL
is checked when the topic is put exactly as a task's url is (scheme, length, the target
rules of the SSRF guard), and again when a task is built from it, since the rules may
have changed since. Enqueueing with ``topic`` instead of ``url`` builds one ordinary
task per URL, each with its own retries; a ``name`` becomes ``<name>:<sha256(url)[:16]>``
per URL, so a repeated fan-out is refused URL by URL and the names stay distinct.
"""

from __future__ import annotations

import hashlib
from typing import Any

from miyamoto.definitions.schedules import check_name
from miyamoto.tasks.task import Task
from miyamoto.tasks.validate import Limits, ValidationError, build_task, check_url

MAX_URLS = 100
MAX_TOPICS = 1000


def parse_topic(data: Any, limits: Limits) -> dict[str, Any]:
    """The stored value of a PUT topic, or ValidationError naming the field."""
    if not isinstance(data, dict):
        raise ValidationError("body", "must be a JSON object")
    unknown = set(data) - {"urls"}
    if unknown:
        raise ValidationError(sorted(unknown)[0], "unknown field")
    urls = data.get("urls")
    if not isinstance(urls, list) or not 1 <= len(urls) <= MAX_URLS:
        raise ValidationError("urls", f"must be a list of 1 to {MAX_URLS} URLs")
    checked = [check_url(f"urls[{i}]", u, limits) for i, u in enumerate(urls)]
    if len(set(checked)) != len(checked):
        raise ValidationError("urls", "must not repeat a URL")
    return {"urls": checked}


def url_suffix(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def expand(fields: dict[str, Any], urls: list[str], *, path_queue: str | None,
           idempotency_key: str | None, limits: Limits, now: float,
           offset: float = 0.0) -> list[Task]:
    """One task per URL from enqueue ``fields`` that name a topic instead of a url
    (``offset``: the cluster's clock minus ours, as ``build_task`` takes it)."""
    if "url" in fields:
        raise ValidationError("topic", "cannot be given with url")
    base = {k: v for k, v in fields.items() if k != "topic"}
    name = base.pop("name", None) or idempotency_key
    if name is not None and not isinstance(name, str):
        raise ValidationError("name", "must be a string")
    tasks = []
    for url in urls:
        one = dict(base, url=url)
        if name:
            one["name"] = f"{name}:{url_suffix(url)}"
        tasks.append(build_task(one, path_queue=path_queue, idempotency_key=None,
                                limits=limits, now=now, offset=offset))
    return tasks


def topic_name(fields: dict[str, Any]) -> str:
    return check_name(fields.get("topic"), "topic")
