"""What a node says about a join that does not happen: the logging half of
``miyamoto.membership.joinwatch`` (silence) and of the membership machine's id clash.

Both are loud on purpose, and rate-limited: a node that cannot join would otherwise
wait forever in silence, with ``/readyz`` saying only "not yet in the cluster roster".
"""

from __future__ import annotations

import logging
from typing import Sequence

from miyamoto.membership import messages as mm
from miyamoto.membership.joinwatch import JoinWatch
from miyamoto.membership.roster import Member

log = logging.getLogger(__name__)

CLASH_EVERY = 10.0  # s between errors about one address that uses our id
MAX_CLASHES = 64


class JoinLog:
    """``heard`` every membership message as it arrives, ``tick`` as time passes."""

    def __init__(self, me: str, seeds: Sequence[str], now: float) -> None:
        self.me = me
        self.watch = JoinWatch(seeds, now)
        self.clashes = 0  # membership messages from another node with our id
        self._clash_logged: dict[str, float] = {}

    def heard(self, sender: str, msg: mm.MembershipMessage, own_inc: str, now: float,
              namesake: Member | None = None) -> None:
        """One membership message; ``namesake``: the live member whose id this JOIN takes
        (``Membership.live_namesake``)."""
        if sender != self.me:
            self.watch.heard(now)
            if namesake is not None:
                self.clashes += 1
                self._clash(msg.sender.cluster, f"the id {sender!r} of the live member at "
                            f"{namesake.cluster[:80]}", now)
        elif msg.sender.id == sender and msg.inc != own_inc:
            self.clashes += 1
            self._clash(msg.sender.cluster, f"this node's id {self.me!r}", now)

    def _clash(self, address: str, whose: str, now: float) -> None:
        if now < self._clash_logged.get(address, float("-inf")):
            return
        if len(self._clash_logged) >= MAX_CLASHES:
            self._clash_logged.clear()
        self._clash_logged[address] = now + CLASH_EVERY
        log.error("cluster: another node, at %.80s, uses %s: refused, nothing it sends is "
                  "taken; give every node its own id (--node, or MIYAMOTO_NODE)", address, whose)

    def tick(self, joining: bool, now: float) -> None:
        quiet = self.watch.check(joining, now)
        if quiet is None:
            return
        log.warning("cluster: joining, and no answer for %.0f s from seed(s) %s. Likely: no "
                    "node listens there; it is an HTTP port, not a cluster port (the seeds "
                    "are the other nodes' cluster endpoints, tcp://HOST:PORT); or that node "
                    "has a different key pair (curve_public, curve_secret: a refused key is "
                    "logged there, and counted in miyamoto_cluster_auth_refused_total); or a "
                    "live member already has this node's id (logged there too)",
                    quiet.silent, ", ".join(quiet.seeds))
