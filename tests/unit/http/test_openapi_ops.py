"""The OpenAPI document (``miyamoto.http.openapi``) as code generators read it: every
operation named and tagged, and no schema a generator can only map to Any. That the
generated clients work against a node is tests/nodes/test_openapi_generators.py."""

from __future__ import annotations

from typing import Any, Iterator

from miyamoto.http.openapi import SPEC

METHODS = ("get", "put", "post", "delete", "patch")


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in SPEC["paths"].items():
        for method, op in ops.items():
            if method in METHODS:
                yield path, method, op


def test_every_operation_has_its_own_operation_id_and_a_declared_tag() -> None:
    declared = {t["name"] for t in SPEC["tags"]}
    ids: dict[str, str] = {}
    for path, method, op in operations():
        where = f"{method.upper()} {path}"
        assert op.get("operationId"), f"{where} has no operationId"
        assert op["operationId"] not in ids, (where, ids.get(op["operationId"]))
        ids[op["operationId"]] = where
        assert len(op.get("tags", [])) == 1 and op["tags"][0] in declared, (where, op.get("tags"))
    assert len(ids) >= 30
    assert {ids["enqueue"], ids["getTask"], ids["cancelTask"]} == \
        {"POST /queue", "GET /tasks/{id}", "DELETE /tasks/{id}"}


def bare_alternatives(schema: Any) -> bool:
    """A schema whose anyOf/oneOf alternatives only list required keys: no type a
    generator can name (openapi-python-client makes it Any, and its isinstance fails)."""
    if not isinstance(schema, dict):
        return False
    for key in ("anyOf", "oneOf"):
        alts = schema.get(key, [])
        if alts and all(isinstance(a, dict) and set(a) <= {"required"} for a in alts):
            return True
    return False


def test_every_request_body_is_a_schema_a_generator_can_type() -> None:
    for name, schema in SPEC["components"]["schemas"].items():
        assert not bare_alternatives(schema), name
    for path, method, op in operations():
        for media, content in op.get("requestBody", {}).get("content", {}).items():
            assert "$ref" in content["schema"], (method, path, media)  # a named type
    enqueue = SPEC["paths"]["/queue"]["post"]["requestBody"]["content"]
    assert enqueue["application/json"]["schema"]["$ref"].endswith("/EnqueueRequest")
    assert enqueue["application/x-www-form-urlencoded"]["schema"]["$ref"].endswith("/TaskForm")
    assert bare_alternatives({"type": "object", "anyOf": [{"required": ["a"]},
                                                          {"required": ["b"]}]})
