"""Request and answer over the cluster's one-way messages (STORE/STORED, REQUEST/REPLY).

Each request gets a fresh id (a random prefix drawn once, then a counter: a uuid4 per
request was a visible share of an enqueue's CPU) and the sender's reply address. The
requests of one ``send`` are one ``Call``: their answers (or a stand-in when a message
could not be sent) are kept on it as they arrive, and the asking greenlet is woken once,
when the last one came or the timeout passed. A peer's answer is matched by its id
only, so a late or forged answer to a forgotten request is dropped. (A gevent Queue, a
Timeout and a closure per request were about a sixth of what a replicated enqueue
costs its entry node beyond a single node's.)
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any, Callable, Generic, Protocol, TypeVar

from gevent.hub import Waiter, get_hub

from miyamoto.replicas import messages as m

K = TypeVar("K")  # what the asker names each request by (an index, a member)
Answer = m.Stored | m.Reply


class SendFn(Protocol):
    """The cluster layer's send: False if the member has no address; ``on_fail`` runs
    when the message could not be delivered."""

    def __call__(self, member_id: str, msg: object, *,
                 on_fail: Callable[[], None]) -> bool: ...


class Call(Generic[K]):
    """The requests of one ``send`` (id -> key) and the answers that came (key ->
    answer). Until the last one came, a later answer to the same request replaces the
    earlier; after, nothing changes them."""

    __slots__ = ("reqs", "answers", "_waiter")

    def __init__(self) -> None:
        self.reqs: dict[str, K] = {}
        self.answers: dict[K, Answer] = {}
        self._waiter: Waiter | None = None  # the asker, while it waits in ``collect``

    @property
    def complete(self) -> bool:
        return len(self.answers) >= len(self.reqs)

    def put(self, req: str, answer: Answer) -> None:
        if req not in self.reqs or self.complete:
            return
        self.answers[self.reqs[req]] = answer
        if self._waiter is not None and self.complete:
            waiter, self._waiter = self._waiter, None
            get_hub().loop.run_callback(waiter.switch, None)

    def unreachable(self, req: str) -> None:
        """The stand-in answer for a peer the message could not reach."""
        self.put(req, m.Reply(req, False, "unreachable"))

    def wait(self, timeout: float) -> None:
        """Until every answer came or ``timeout`` passed."""
        if self.complete:
            return
        hub = get_hub()
        waiter = self._waiter = Waiter(hub)
        timer = hub.loop.timer(timeout)
        timer.start(waiter.switch, None)
        try:
            waiter.get()
        finally:
            timer.close()
            self._waiter = None


class Requests:
    def __init__(self, send: SendFn, reply_to: str):
        self._send = send
        self._reply_to = reply_to
        self._pending: dict[str, Call[Any]] = {}
        self._prefix = os.urandom(8).hex()
        self._numbers = itertools.count()

    def answer(self, msg: Answer) -> None:
        """An answer came: hand it to the call waiting for it, if any."""
        call = self._pending.get(msg.req)
        if call is not None:
            call.put(msg.req, msg)

    def send(self, asks: dict[K, tuple[str, Callable[[str, str], object]]]) -> Call[K]:
        """Send each request (key -> member, build(req, reply_to) -> message); answers
        (or stand-ins for unreachable members) are kept on the returned call."""
        call: Call[K] = Call()
        for key, (member, build) in asks.items():
            req = f"{self._prefix}{next(self._numbers):x}"
            call.reqs[req] = key
            self._pending[req] = call
            fail = functools.partial(call.unreachable, req)
            if not self._send(member, build(req, self._reply_to), on_fail=fail):
                fail()
        return call

    def collect(self, call: Call[K], timeout: float) -> dict[K, Answer]:
        """Answers by key, once all came or timeout passed; the call's requests are then
        forgotten (a later answer to one is dropped)."""
        if not call.reqs:  # nothing was asked: no timer, no wait
            return {}
        try:
            call.wait(timeout)
        finally:
            for req in call.reqs:
                self._pending.pop(req, None)
        return call.answers  # (complete or forgotten: nothing changes it now)

    def ask_all(self, members: list[str], op: str, args: dict,
                timeout: float) -> dict[str, Any]:
        """REQUEST ``op`` of each member; the results of those that answered in time."""
        call = self.send({mem: (mem, lambda req, to: m.Request(req, to, op, args))
                          for mem in members})
        answers = self.collect(call, timeout)
        return {mem: a.result for mem, a in answers.items() if a.ok}
