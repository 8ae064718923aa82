"""The OpenAPI pieces of priorities, flow keys and GET /targets (``miyamoto.http.openapi``
takes them in), kept next to their checks in ``dispatchfields``."""

from __future__ import annotations

from typing import Any

from miyamoto.tasks.fields import MAX_FLOW_KEY, MAX_FLOW_PARALLELISM, MAX_FLOW_RATE, \
                                  PRIORITY_DEFAULT, PRIORITY_MAX, PRIORITY_MIN

DISPATCH_FIELDS: dict[str, Any] = {
    "priority": {"type": ["integer", "null"], "minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX,
                 "default": PRIORITY_DEFAULT, "description": "higher goes first among a "
                 "queue's waiting due tasks; a wait of 10 s counts as one level (aging)"},
    "flow_key": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_FLOW_KEY,
                 "description": "tasks sharing a key share flow_rate and flow_parallelism, "
                 "across queues and the cluster"},
    "flow_rate": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": MAX_FLOW_RATE,
                  "description": "tasks/s for the key (with flow_key; the last task seen sets it)"},
    "flow_parallelism": {"type": ["integer", "null"], "minimum": 1,
                         "maximum": MAX_FLOW_PARALLELISM,
                         "description": "deliveries in flight for the key (with flow_key)"},
}

TARGETS_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["targets"], "properties": {"targets": {
        "type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["origin", "state", "failures", "inflight", "retry_at"],
            "properties": {
                "origin": {"type": "string", "description": "scheme://host:port"},
                "state": {"enum": ["closed", "open", "half_open"]},
                "failures": {"type": "integer", "minimum": 0,
                             "description": "consecutive failed attempts"},
                "inflight": {"type": "integer", "minimum": 0},
                "retry_at": {"type": ["number", "null"],
                             "description": "open: when the probe may go (unix time)"}}}}}}
