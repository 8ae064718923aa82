"""The definitions' messages (``miyamoto.definitions.messages``): each one through the real
encoding and back, and a peer's malformed payload a DecodeError naming what is wrong,
with the bounds (value size, entries per message, index items) at their edges."""

from __future__ import annotations

from typing import Any

import pytest

from miyamoto.definitions import messages as dm
from miyamoto.wire import messages as m
from miyamoto.wire import verbs as protocol
from miyamoto.wire.verbs import DecodeError, Verb

pytestmark = pytest.mark.timeout(10)

ENTRY = {"kind": "topic", "name": "t", "term": 1, "seq": 2, "value": {"urls": []}}


def wire(msg: Any) -> Any:
    verb, payload = protocol.decode(protocol.encode(msg.verb, msg.payload()))
    return m.decode(verb, payload)


@pytest.mark.parametrize("msg", [
    dm.DefsPut(1, (dm.Entry("schedule", "s", 1, 2, {"every": 1}),), wid=3, want=True,
               last=True, index=(("schedule", "s", 1, 2),)),
    dm.DefsPut(4, (dm.Entry("cursor", "s", 1, 2, None),)),
    dm.DefsAck(2, 7), dm.DefsDigest(3, "ab" * 16, "a"), dm.DefsDigest(3, "ab" * 16),
    dm.DefsWrite("r", "tcp://127.0.0.1:1", "put", "topic", "t", {"urls": ["u"]}),
    dm.DefsWrite("r", "tcp://127.0.0.1:1", "delete", "schedule", "s"),
    dm.DefsWrote("r", 409, {"status": "error", "error": "x"})])
def test_each_message_round_trips(msg: Any) -> None:
    assert wire(msg) == msg


def test_a_put_without_flags_or_index_reads_as_their_defaults() -> None:
    put = m.decode(Verb.DEFS_PUT, {"term": 1, "entries": [ENTRY]})
    assert (put.wid, put.want, put.last, put.index) == (None, False, False, None)
    assert "index" not in dm.DefsPut(1, ()).payload()


def big(n: int) -> dict:
    """A value whose JSON is exactly ``n`` bytes."""
    v = {"x": ""}
    v["x"] = "a" * (n - len('{"x":""}'))
    return v


def test_a_value_may_be_max_value_bytes_and_no_more() -> None:
    assert dm.MAX_VALUE == 512 * 1024
    assert dm.Entry.from_payload(dict(ENTRY, value=big(dm.MAX_VALUE))).value is not None
    with pytest.raises(DecodeError, match="value is too large"):
        dm.Entry.from_payload(dict(ENTRY, value=big(dm.MAX_VALUE + 1)))
    write = {"req": "r", "reply_to": "x", "op": "put", "kind": "topic", "name": "t"}
    assert m.decode(Verb.DEFS_WRITE, dict(write, value=big(dm.MAX_VALUE))).value
    with pytest.raises(DecodeError, match="value is too large"):
        m.decode(Verb.DEFS_WRITE, dict(write, value=big(dm.MAX_VALUE + 1)))


def test_entries_per_message_and_index_items_are_bounded() -> None:
    most = [dict(ENTRY, name=f"t{i}") for i in range(dm.MAX_PER_MESSAGE)]
    assert len(m.decode(Verb.DEFS_PUT, {"term": 1, "entries": most}).entries) == 64
    with pytest.raises(DecodeError):
        m.decode(Verb.DEFS_PUT, {"term": 1, "entries": most + [ENTRY]})
    assert dm.MAX_PER_MESSAGE == 64 and dm.MAX_INDEX == 10000


@pytest.mark.parametrize("verb,payload,why", [
    (Verb.DEFS_PUT, {"term": 1, "entries": [5]}, "entry must be an object"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [dict(ENTRY, kind="evil")]}, "kind must be one of"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [dict(ENTRY, kind="")]}, "kind"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [dict(ENTRY, name="n" * 201)]}, "name"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [dict(ENTRY, value=[1])]}, "value must be an object"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [dict(ENTRY, seq=-1)]}, "seq"),
    (Verb.DEFS_PUT, {"term": -1, "entries": []}, "term"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [], "wid": "1"}, "wid"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [], "want": 1}, "want must be a boolean"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [], "index": [[1]]}, "index items"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [], "index": ["abcd"]}, "index items"),
    (Verb.DEFS_PUT, {"term": 1, "entries": [], "index": [["evil", "n", 1, 1]]}, "kind"),
    (Verb.DEFS_ACK, {"term": 1}, "wid"),
    (Verb.DEFS_DIGEST, {"term": 1, "digest": "x" * 65}, "digest"),
    (Verb.DEFS_DIGEST, {"term": 1, "digest": "x", "owner": 5}, "owner"),
    (Verb.DEFS_WRITE, {"req": "r", "reply_to": "x", "op": "drop", "kind": "topic",
                       "name": "t"}, "op must be one of put, merge, delete, pause, resume"),
    (Verb.DEFS_WRITE, {"req": "r", "reply_to": "x", "op": "put", "kind": "evil",
                       "name": "t"}, "unknown kind"),
    (Verb.DEFS_WRITE, {"req": "r", "reply_to": "x", "op": "put", "kind": "topic",
                       "name": "t", "value": "v"}, "value must be an object"),
    (Verb.DEFS_WROTE, {"req": "r", "status": 999, "body": {}}, "status"),
    (Verb.DEFS_WROTE, {"req": "r", "status": 99, "body": {}}, "status"),
    (Verb.DEFS_WROTE, {"req": "r", "status": 200, "body": []}, "body")])
def test_a_malformed_payload_names_what_is_wrong(verb: Verb, payload: dict, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        m.decode(verb, payload)


def test_every_kind_and_the_status_edges() -> None:
    for kind in ("schedule", "topic", "cursor"):
        assert dm.Entry.from_payload(dict(ENTRY, kind=kind)).kind == kind
    for status in (100, 599):
        assert m.decode(Verb.DEFS_WROTE, {"req": "r", "status": status, "body": {}}).status == \
            status
    for op in ("put", "delete", "pause", "resume"):
        assert m.decode(Verb.DEFS_WRITE, {"req": "r", "reply_to": "x", "op": op,
                                          "kind": "cursor", "name": "n"}).op == op
