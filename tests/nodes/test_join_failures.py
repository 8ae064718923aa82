"""A join that cannot happen is loud, on real node processes: a joiner with another key
pair, seeds at an HTTP port and at a closed port, two live nodes with one id; and a
healthy join says none of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from helpers import NodeProcess, free_port, loaded, metrics, wait_converged, wait_until

SILENCE = "joining, and no answer for"


def _other_keys() -> dict[str, str]:
    public, secret = zmq.curve_keypair()
    return {"curve_public": public.decode(), "curve_secret": secret.decode()}


@pytest.mark.timeout(40)
def test_a_joiner_with_another_key_pair_is_refused_loudly_on_both_sides(node_factory):
    seed = node_factory("seed")
    joiner = node_factory("joiner", options=_other_keys(), seeds=[seed.cluster_addr],
                          ready=False)
    wait_until(lambda: SILENCE in joiner.log_text(), timeout=loaded(15),
               what="the joiner's warning")
    line = next(ln for ln in joiner.log_text().splitlines() if SILENCE in ln)
    assert "WARNING" in line and seed.cluster_addr in line and "different key pair" in line
    wait_until(lambda: (metrics(seed) or {}).get("cluster_auth_refused_total", 0) >= 1,
               timeout=loaded(10), what="the seed's refused-key counter")
    # the refusal names the peer (read from the accepted fd, which a loaded hub can read
    # only after it closed: "?" then; the joiner keeps redialling, so a later one names it)
    wait_until(lambda: "refused CURVE client from 127.0.0.1:" in seed.log_text(),
               timeout=loaded(10), what="a refusal that names the joiner's address")


@pytest.mark.timeout(40)
def test_seeds_at_an_http_port_and_a_closed_port_are_named(node_factory):
    other = node_factory("other")
    http_as_seed, closed = f"tcp://127.0.0.1:{other.http_port}", f"tcp://127.0.0.1:{free_port()}"
    joiner = node_factory("joiner", seeds=[http_as_seed, closed], ready=False)
    wait_until(lambda: SILENCE in joiner.log_text(), timeout=loaded(15),
               what="the joiner's warning")
    line = next(ln for ln in joiner.log_text().splitlines() if SILENCE in ln)
    assert http_as_seed in line and closed in line and "HTTP port" in line
    assert "no node listens there" in line
    assert joiner.get("/readyz").status_code == 503


@pytest.mark.timeout(40)
def test_two_live_nodes_with_one_id_are_refused_with_an_error_on_both_sides(
        tmp_path: Path, proc_registry):
    one = NodeProcess(tmp_path / "one", "twin", registry=proc_registry)
    two = NodeProcess(tmp_path / "two", "twin", registry=proc_registry)
    one.seeds, two.seeds = [two.cluster_addr], [one.cluster_addr]
    one.start(), two.start()
    for me, other in ((one, two), (two, one)):
        wait_until(lambda: "uses this node's id 'twin'" in me.log_text(), timeout=loaded(15),
                   what="the clash error")
        line = next(ln for ln in me.log_text().splitlines() if "uses this node's id" in ln)
        assert "ERROR" in line and other.cluster_addr in line, line
        assert "payload names sender" not in me.log_text()


@pytest.mark.timeout(40)
def test_a_healthy_join_warns_of_nothing(cluster_factory):
    nodes = cluster_factory(2)
    wait_converged(nodes)
    for n in nodes:
        text = n.log_text()
        assert SILENCE not in text and "dropped" not in text and "refused" not in text, text


@pytest.mark.timeout(40)
def test_a_node_with_a_live_members_id_is_refused_and_the_member_stays(cluster_factory,
                                                                        tmp_path: Path,
                                                                        proc_registry):
    a, b = cluster_factory(2, ids=["a", "b"])
    twin = NodeProcess(tmp_path / "twin", "b", seeds=[a.cluster_addr], registry=proc_registry)
    twin.start()
    wait_until(lambda: "uses the id 'b' of the live member" in a.log_text(), timeout=loaded(15),
               what="the leader's clash error")
    line = next(ln for ln in a.log_text().splitlines() if "of the live member" in ln)
    assert "ERROR" in line and twin.cluster_addr in line and b.cluster_addr in line, line
    wait_until(lambda: SILENCE in twin.log_text(), timeout=loaded(15), what="the twin's warning")
    view = a.get("/cluster").json()
    assert sorted(m["id"] for m in view["members"]) == ["a", "b"], view
    assert any(m["cluster"] == b.cluster_addr for m in view["members"] if m["id"] == "b"), view
