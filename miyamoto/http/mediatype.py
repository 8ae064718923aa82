"""Which body an enqueue request carries, from its Content-Type and, only where the
type is missing or wrong, a look at the body.

The rules, and why:

* ``application/json`` (or any ``+json`` type) is JSON; a form type is a form.
* No Content-Type at all and a body that parses as a JSON object: it is JSON. There is
  no declared type to contradict, and a form body never parses as a JSON object.
  Any other body without a type stays a form, as before.
* A declared type that is neither (``text/plain``, a misspelt ``applicatoin/json``,
  ``multipart/form-data``...) is answered 415 naming the accepted types; when the
  body is a JSON object the answer says to send ``Content-Type: application/json``.
  The client stated a type, and silently reading the body as something else would
  hide its bug in every other client it writes.
* A form type whose body is a JSON object (curl's ``-d '{...}'`` without ``-H``) is
  answered 415 with the same hint, not reinterpreted: a genuine form post is one of
  ``key=value`` pairs and never a JSON object, so this refuses without guessing.
"""

from __future__ import annotations

import ujson

from miyamoto.tasks.validate import ValidationError

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
ACCEPTED = f"{JSON} or {FORM}"
HINT = f"send Content-Type: {JSON} with a JSON body"


def media_type(content_type: str) -> str:
    """The bare, lower-cased media type: no parameters, no whitespace."""
    return content_type.split(";")[0].strip().lower()


def is_json_type(mt: str) -> bool:
    return mt == JSON or (mt.startswith("application/") and mt.endswith("+json"))


def _json_object(body: bytes) -> bool:
    if not body.lstrip()[:1] == b"{":
        return False
    try:
        return isinstance(ujson.loads(body), dict)
    except (ValueError, UnicodeDecodeError):
        return False


def enqueue_kind(content_type: str, body: bytes) -> str:
    """JSON or FORM for one task's body; ValidationError(415) for any other type."""
    mt = media_type(content_type)
    if is_json_type(mt):
        return JSON
    looks_json = _json_object(body)
    if mt == "" and looks_json:
        return JSON
    if mt in ("", FORM) and not looks_json:
        return FORM
    if looks_json:
        raise ValidationError("Content-Type", f"is {mt!r} but the body is a JSON object: "
                                              f"{HINT}", 415)
    raise ValidationError("Content-Type", f"{mt!r} is not accepted: send {ACCEPTED}", 415)


def check_batch(content_type: str) -> None:
    """A batch is JSON: a missing type is taken as JSON (as before), any other 415."""
    mt = media_type(content_type)
    if mt and not is_json_type(mt):
        raise ValidationError("Content-Type", f"{mt!r} is not accepted for a batch: {HINT} "
                                              "list", 415)
