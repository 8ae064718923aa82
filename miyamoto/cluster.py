"""Placeholder: a node alone. Replaced by the replicated cluster layer."""

from __future__ import annotations

from typing import Any

from miyamoto.errors import Duplicate
from miyamoto.task import State, Task


class Cluster:
    def __init__(self, node: Any):
        self.node = node
        self.engine = node.engine

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def leave(self) -> None: ...

    def enqueue(self, task: Task) -> Task:
        task = task.evolve(replicas=(self.node.node_id,), replica=0)
        return self.engine.add(task)

    def enqueue_many(self, tasks: list[Task]) -> list[dict[str, Any]]:
        out = []
        for t in tasks:
            try:
                s = self.enqueue(t)
                out.append({"status": "scheduled", "id": s.id, "queue": s.queue, "eta": s.eta})
            except Duplicate as e:
                out.append({"status": "duplicate", "id": e.original_id})
        return out

    def get_task(self, task_id: str) -> dict[str, Any] | None:
        t = self.engine.get(task_id)
        return None if t is None else t.summary()

    def cancel(self, task_id: str) -> dict[str, Any] | None:
        t = self.engine.cancel(task_id)
        return None if t is None else t.summary()

    def rerun(self, task_id: str) -> dict[str, Any] | None:
        t = self.engine.rerun(task_id)
        return None if t is None else t.summary()

    def queue_counts(self) -> dict[str, dict[str, int]]:
        return self.engine.queue_counts()

    def list_tasks(self, queue: str, state: State, limit: int) -> list[dict[str, Any]]:
        return [t.summary() for t in self.engine.list(queue, state, limit)]

    def control(self, queue: str, action: str) -> dict[str, Any]:
        if action == "purge":
            return {"purged": self.engine.purge(queue)}
        self.engine.pause(queue, action == "pause")
        return {}

    def info(self) -> dict[str, Any]:
        me = self.node
        return {"node": me.node_id, "leader": me.node_id, "term": 1, "version": 1,
                "members": [{"id": me.node_id, "http": me.config.http,
                             "cluster": me.config.advertise, "health": 0.0}]}

    def ready(self) -> tuple[bool, str]:
        return True, "ok"
