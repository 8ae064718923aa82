"""The Python client's operations on schedules and topics (``Client`` inherits them).

Writes are idempotent (a put replaces, a delete of what is gone is NotFound), so they
are retried on 503 like a named enqueue: a leader change answers 503 for a moment.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence
from urllib.parse import quote


def _seg(value: str) -> str:
    return quote(str(value), safe="")


class DefinitionsClient:
    """Mixed into ``miyamoto.client.Client``, whose ``_call`` it uses."""

    def _call(self, method: str, path: str, *, retry: bool = False,
              **kw: Any) -> dict[str, Any]:  # pragma: no cover - Client's
        raise NotImplementedError

    # ------------------------------------------------------------ schedules
    def schedule(self, name: str, task: Mapping[str, Any], *, cron: str | None = None,
                 every: int | None = None, timezone: str | None = None,
                 catch_up: str | None = None, paused: bool | None = None) -> dict[str, Any]:
        """Create or replace a recurring schedule: ``task`` holds enqueue fields (``url``,
        ``params``, ``queue``...); give ``cron`` ("0 3 * * *") or ``every`` (seconds).
        Returns the schedule with its next fire times; InvalidTask names a bad field."""
        body: dict[str, Any] = {"name": name, "task": dict(task)}
        for key, value in (("cron", cron), ("every", every), ("timezone", timezone),
                           ("catch_up", catch_up), ("paused", paused)):
            if value is not None:
                body[key] = value
        return self._call("POST", "/schedules", json=body, retry=True)

    def schedules(self) -> list[dict[str, Any]]:
        """Every schedule with its next fire times and last task ids."""
        return list(self._call("GET", "/schedules").get("schedules", []))

    def get_schedule(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/schedules/{_seg(name)}")

    def unschedule(self, name: str) -> dict[str, Any]:
        """Delete a schedule (NotFound if there is none)."""
        return self._call("DELETE", f"/schedules/{_seg(name)}", retry=True)

    def pause_schedule(self, name: str) -> dict[str, Any]:
        return self._call("POST", f"/schedules/{_seg(name)}/pause", retry=True)

    def resume_schedule(self, name: str) -> dict[str, Any]:
        return self._call("POST", f"/schedules/{_seg(name)}/resume", retry=True)

    # ------------------------------------------------------------ topics
    def put_topic(self, name: str, urls: Sequence[str]) -> dict[str, Any]:
        """Create or replace a fan-out topic: enqueueing with it makes one task per URL."""
        return self._call("PUT", f"/topics/{_seg(name)}", json={"urls": list(urls)},
                          retry=True)

    def topics(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/topics").get("topics", []))

    def topic(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/topics/{_seg(name)}")

    def delete_topic(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/topics/{_seg(name)}", retry=True)

    def publish(self, topic: str, params: Mapping[str, Any] | None = None,
                **fields: Any) -> dict[str, Any]:
        """Enqueue one task per URL of ``topic``: ``{"status", "ids", "tasks": [{"url",
        "id"}...]}``. ``fields`` as ``enqueue`` takes them (a ``name`` is suffixed per URL)."""
        body: dict[str, Any] = {"topic": topic}
        if params:
            body["params"] = dict(params)
        body.update({k: v for k, v in fields.items() if v is not None})
        return self._call("POST", "/queue", json=body, retry=body.get("name") is not None)
