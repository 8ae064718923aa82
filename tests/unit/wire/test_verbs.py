"""The cluster's frames (``miyamoto.wire.verbs``) and the typed messages' registry
(``miyamoto.wire.messages``): two frames a message, and every malformed one a
DecodeError, never anything else."""

from __future__ import annotations

import pytest

from miyamoto.definitions import messages as dm  # registers the DEFS_* messages
from miyamoto.wire import messages, verbs
from miyamoto.wire.verbs import DecodeError, Verb

pytestmark = pytest.mark.timeout(10)


def test_two_frames_each_way() -> None:
    frames = verbs.encode(Verb.STORE, {"id": "é", "n": 1})
    assert frames == [b"STORE", '{"id":"é","n":1}'.encode()]
    assert verbs.decode(frames) == (Verb.STORE, {"id": "é", "n": 1})
    assert verbs.encode(Verb.BATCH, b'{"m":[]}') == [b"BATCH", b'{"m":[]}']
    assert verbs.decode([memoryview(b"ASK"), memoryview(b"{}")]) == (Verb.ASK, {})
    assert all(verbs.decode(verbs.encode(v, {}))[0] is v for v in Verb)


@pytest.mark.parametrize("frames,why", [
    ([b"STORE"], "expected 2 frames, got 1"), ([b"STORE", b"{}", b"x"], "got 3"),
    ([b"NOPE", b"{}"], "unknown verb"), ([b"store", b"{}"], "unknown verb"),
    ([b"STORE", b"{no"], "not JSON"), ([b"STORE", b"\xff"], "not JSON"),
    ([b"STORE", b"[1]"], "not a JSON object"),
    ([b"STORE", b" " * (7 * 1024 * 1024 + 1)], "too large")])
def test_a_malformed_frame_is_a_decode_error(frames: list[bytes], why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        verbs.decode(frames)


def test_a_frame_of_exactly_the_limit_is_read() -> None:
    """7 MiB: a 1 MiB body of control characters is ~6 MiB as JSON."""
    body = b'{"k": "' + b"x" * (7 * 1024 * 1024 - 9) + b'"}'
    assert len(body) == 7 * 1024 * 1024
    assert verbs.decode([b"STORE", body])[1]["k"].startswith("x")


def test_a_verb_without_a_message_type_or_a_payload_that_is_no_object() -> None:
    registered = dict(messages._DECODERS)
    try:
        messages._DECODERS.pop(Verb.BATCH, None)
        with pytest.raises(DecodeError, match="no message type for BATCH"):
            messages.decode(Verb.BATCH, {})
    finally:
        messages._DECODERS.clear()
        messages._DECODERS.update(registered)
    assert Verb.DEFS_ACK in registered  # registered by importing its module
    with pytest.raises(DecodeError, match="payload is not an object"):
        messages.decode(Verb.DEFS_ACK, [])  # type: ignore[arg-type]
    assert messages.decode(Verb.DEFS_ACK, {"term": 1, "wid": 2}) == dm.DefsAck(1, 2)
