"""Errors the HTTP API turns into answers."""

from __future__ import annotations


class Duplicate(Exception):
    """The task's name is taken within the de-duplication window (409)."""

    def __init__(self, original_id: str):
        super().__init__(original_id)
        self.original_id = original_id


class Conflict(Exception):
    """The task is in a state that does not allow the operation (409)."""


class Unavailable(Exception):
    """The node cannot take the request now: stopping, or too few replicas (503)."""
