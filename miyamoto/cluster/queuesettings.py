"""Carries the queue settings the cluster's definitions hold into this node's engine.

The definitions (kind "queue", ``miyamoto.definitions.queues``) say what the API set for
each queue; every node applies them when its set changes (``DefSync``'s ``on_change``)
and once at start, after the set is read back. Settings take effect at once
(``Engine.set_queue_settings``). A pause is applied on its edge only: when the
definition's ``paused`` changed since last applied (a dropped one goes back to the
config's), and then only if the queue is not so already; so a pause or resume made
through POST /queues/<name>/pause of a queue the API never paused is not undone by a
change of another setting. A definition that does not fit (a peer's bytes) is logged
and left out.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from miyamoto.definitions.queues import stored
from miyamoto.engine.engine import Engine
from miyamoto.tasks.checks import ValidationError

log = logging.getLogger(__name__)


class QueueSettings:
    def __init__(self, engine: Engine, control: Callable[[str, str], Any]):
        self.engine = engine
        self.control = control  # (queue, "pause" | "resume"): this node only
        self._paused: dict[str, bool] = {}  # each definition's paused, as last applied

    def apply(self, items: Iterable[tuple[str, dict]]) -> list[str]:
        """Make ``items`` ((queue, value) of every queue definition) the settings in
        effect; returns the queues whose settings changed."""
        checked: dict[str, dict[str, Any]] = {}
        for name, value in items:
            try:
                checked[name] = stored(value)
            except ValidationError as e:
                log.warning("queues: the settings of %s do not fit (%s): left out", name, e)
        changed = self.engine.set_queue_settings(checked)
        for name in changed:
            old, new = self._paused.get(name), checked.get(name, {}).get("paused")
            if new == old:
                continue
            want = new if new is not None else self.engine.config.queue(name).paused
            if self.engine.dispatcher.summary(name)[1] != want:
                log.info("queues: %s %s (its settings)", name, "paused" if want else "resumed")
                self.control(name, "pause" if want else "resume")
        self._paused = {n: v["paused"] for n, v in checked.items() if "paused" in v}
        return changed
