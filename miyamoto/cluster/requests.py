"""Request and answer over the cluster's one-way messages (STORE/STORED, REQUEST/REPLY).

Each request gets a fresh id (a random prefix drawn once, then a counter: a uuid4 per
request was a visible share of an enqueue's CPU) and the sender's reply address; the answer (or a stand-in
when the message could not be sent) arrives on a queue that the asking greenlet reads
until every answer came or the timeout passed. A peer's answer is matched by its id
only, so a late or forged answer to a forgotten request is dropped.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Callable, Protocol, TypeVar

import gevent
import gevent.queue

from miyamoto.replicas import messages as m

K = TypeVar("K")  # what the asker names each request by (an index, a member)
Answer = m.Stored | m.Reply


class SendFn(Protocol):
    """The cluster layer's send: False if the member has no address; ``on_fail`` runs
    when the message could not be delivered."""

    def __call__(self, member_id: str, msg: object, *,
                 on_fail: Callable[[], None]) -> bool: ...


class Requests:
    def __init__(self, send: SendFn, reply_to: str):
        self._send = send
        self._reply_to = reply_to
        self._pending: dict[str, gevent.queue.Queue] = {}
        self._prefix = os.urandom(8).hex()
        self._numbers = itertools.count()

    def answer(self, msg: Answer) -> None:
        """An answer came: hand it to the request waiting for it, if any."""
        q = self._pending.get(msg.req)
        if q is not None:
            q.put((msg.req, msg))

    def send(self, asks: dict[K, tuple[str, Callable[[str, str], object]]]
             ) -> tuple[gevent.queue.Queue, dict[str, K]]:
        """Send each request (key -> member, build(req, reply_to) -> message); answers
        (or stand-ins for unreachable members) arrive on the returned queue."""
        q: gevent.queue.Queue = gevent.queue.Queue()
        reqs: dict[str, K] = {}
        for key, (member, build) in asks.items():
            req = f"{self._prefix}{next(self._numbers):x}"
            reqs[req] = key
            self._pending[req] = q
            fail = _failer(q, req)
            if not self._send(member, build(req, self._reply_to), on_fail=fail):
                fail()
        return q, reqs

    def collect(self, q: gevent.queue.Queue, reqs: dict[str, K],
                timeout: float) -> dict[K, Answer]:
        """Answers by key, until all came or timeout; then forget the requests."""
        answers: dict[K, Answer] = {}
        if not reqs:  # nothing was asked: no queue to wait on, no timer
            return answers
        try:
            with gevent.Timeout(timeout, False):
                while len(answers) < len(reqs):
                    req, answer = q.get()
                    if req in reqs:
                        answers[reqs[req]] = answer
        finally:
            for req in reqs:
                self._pending.pop(req, None)
        return answers

    def ask_all(self, members: list[str], op: str, args: dict,
                timeout: float) -> dict[str, Any]:
        """REQUEST ``op`` of each member; the results of those that answered in time."""
        q, reqs = self.send({mem: (mem, lambda req, to: m.Request(req, to, op, args))
                             for mem in members})
        answers = self.collect(q, reqs, timeout)
        return {mem: a.result for mem, a in answers.items() if a.ok}


def _failer(q: gevent.queue.Queue, req: str) -> Callable[[], None]:
    """An answer standing in for a peer that could not be reached."""
    return lambda: q.put((req, m.Reply(req, False, "unreachable")))
