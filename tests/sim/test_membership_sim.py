"""The membership simulator under a Byzantine-lite sender (tests/sim/membership_sim.py).

The honest runs (loss, partitions, pauses, crashes) are in tests/unit/membership/; these
are the attacks: a key holder that is not a member replays, inflates terms and speaks for
members, and one member sends a frame with term 2**52. Each checker is shown to catch a
machine with the rule it relies on taken out.
"""

from __future__ import annotations

import pytest

from membership_sim import attack_run, glitch_run
from miyamoto.membership.machine import Membership
from miyamoto.wire.verbs import Verb

MODES = {
    "outsider": {},
    "outsider-forging-routing-ids": {"forge_routing": True},
    "former-member": {"former": True},
    "former-member-forging-routing-ids": {"former": True, "forge_routing": True},
    "outsider-with-faults": {"faults": True},
    "forging-with-faults": {"faults": True, "forge_routing": True},
    "former-forging-with-faults": {"faults": True, "former": True, "forge_routing": True},
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_an_attacker_moves_no_term_and_the_cluster_keeps_a_leader(mode):
    """40 seeds per mode, 15 s of attack each. Without faults the leader and its term never
    change; with a leader killed and a follower cut off, an agreed leader is back within
    three election timeouts every time, and no term rose by more than a few."""
    worst = 0.0
    for seed in range(40):
        worst = max(worst, attack_run(seed, **MODES[mode])["worst_leaderless"])
    print(f"{mode}: longest leaderless stretch {worst:.2f}s")


@pytest.mark.timeout(60)
def test_one_absurd_frame_from_a_member_is_dropped():
    for seed in range(50):
        out = glitch_run(seed)
        assert out["terms"][1] == out["terms"][0], out


class _Trusting(Membership):
    """The member rule taken out: anyone's word counts as a member's."""

    def _member(self, m) -> bool:
        return True


class _Unbounded(Membership):
    """The step taken out: a member's term is taken however high."""

    def _raise(self, term: int, now: float) -> bool:
        self._adopt_term(term, now)
        return True


class _AsItWas(_Trusting, _Unbounded):
    """Both: the machine before terms were guarded."""


def _failures(run, membership, seeds, **kw) -> list[str]:
    out = []
    for seed in seeds:
        try:
            run(seed, membership=membership, **kw)
        except AssertionError as e:
            out.append(str(e))
    return out


@pytest.mark.timeout(60)
def test_the_attack_checker_catches_a_machine_that_trusts_strangers():
    caught = _failures(attack_run, _Trusting, range(5))
    assert len(caught) == 5 and all("moved the leader or its term" in c for c in caught)
    # and without the step either, as before: the attack leaves the cluster leaderless
    caught = _failures(attack_run, _AsItWas, range(5), faults=True)
    assert len(caught) == 5 and all("no agreed leader" in c for c in caught), caught


@pytest.mark.timeout(60)
def test_the_glitch_checker_catches_a_machine_without_the_step():
    # (the ACK: VOTEs are heard only while campaigning, vote requests not near a leader)
    caught = _failures(glitch_run, _Unbounded, range(10), verb=Verb.HEARTBEAT_ACK)
    assert len(caught) == 10 and all("no agreed leader" in c for c in caught), caught
