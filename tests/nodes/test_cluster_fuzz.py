"""Fuzzing cluster frames: typed decoding raises only DecodeError, and a real node fed
hypothesis-made messages from an admitted peer (the cluster key, a member's id) stays
up, logs no traceback and still obeys a valid message afterwards. Bounded: a few hundred
examples, well under 30 s together."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import as_member, dealer, wait_until
from miyamoto.wire import messages
from miyamoto.wire.verbs import DecodeError, Verb

# every field name a payload of ours carries, so that the fuzz reaches the field checks
FIELDS = ["id", "replica", "delay", "attempts", "last", "req", "reply_to", "op", "args",
          "task", "tasks", "replicas", "term", "inc", "from", "roster", "ok", "rterm",
          "version", "granted", "leader", "address", "boot", "lease", "state", "ids",
          "members", "cluster", "http", "floor", "queue", "action", "limit", "error",
          "value", "answer", "copies", "until", "name", "status"]

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
           | st.floats(allow_nan=False) | st.text(max_size=40)
           | st.sampled_from(["", "a", "n1", "default", "purge", "cancel", "get", "x" * 300]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner,
                                        max_size=5), max_leaves=25)
payloads = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)
verbs = st.sampled_from([v for v in Verb if v != Verb.BATCH])


@pytest.mark.timeout(60)
@settings(max_examples=400, deadline=None)
@given(verbs, payloads)
def test_typed_decoding_raises_only_decode_error(verb, payload):
    try:
        msg = messages.decode(verb, payload)
    except DecodeError:
        return
    # what decodes re-encodes to a payload that decodes to the same message
    assert messages.decode(verb, json.loads(json.dumps(msg.payload()))) == msg




@pytest.mark.timeout(120)
def test_a_node_survives_fuzzed_frames_from_an_admitted_peer(node_factory, sink):
    n = node_factory("fuzzed")
    control = n.enqueue(url=f"{sink.url}/control", countdown=60)
    marker = n.enqueue(url=f"{sink.url}/marker", countdown=2)
    # the node's own key (a member speaks only with its own): an admitted peer
    s = dealer(n.cluster_addr, n.node_id.encode() + b"\x00fuzz", **as_member(n))
    sent = 0

    @settings(max_examples=300, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(verbs | st.just(Verb.BATCH), payloads, st.booleans())
    def send(verb, payload, raw):
        nonlocal sent
        if raw:  # frames that are not even a payload object
            s.send_multipart([verb.value.encode(), json.dumps(list(payload.values())).encode()])
        else:
            s.send_multipart([verb.value.encode(), json.dumps(payload).encode()])
        sent += 1

    send()
    # the positive control, after the fuzz on the same connection (so it was all read)
    s.send_multipart([b"CANCEL", json.dumps({"id": control["id"]}).encode()])
    s.close()
    wait_until(lambda: n.task(control["id"])["state"] == "cancelled", 15,
               what="the control task cancelled after the fuzz")
    print(f"\nsent {sent} fuzzed messages")
    assert sent >= 100
    assert n.running, n.log_text(40)
    text = n.log_text()
    assert "Traceback" not in text and "on_message failed" not in text, n.log_text(80)
    assert n.get("/healthz").status_code == 200
    (req,) = sink.wait_for(count=1, path="/marker", timeout=15)
    assert req.task_id == marker["id"]
