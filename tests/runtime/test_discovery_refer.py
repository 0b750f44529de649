"""A relay that says Hello to a relay it does not work with (it bootstraps through it) is not answered with a Hello
but referred: a PeerList of the peers the receiver knows that the sender works with (discovery.py `_refer`)."""

from __future__ import annotations

from types import SimpleNamespace

from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net import discovery as disc
from gwtf_node.runtime.net.discovery import Discovery
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place


def _addr(port: int, pid: str) -> str:
    return f"/ip4/127.0.0.1/tcp/{port}/p2p/{pid}"


def _relay_of_stage_0(spawned: list) -> Discovery:
    peers = Peers("ME", "r0_0", 4, Place("relay", 0, 2))
    peers.upsert(PeerInfo("D0", "data", -1, "d0", addrs=(_addr(1, "D0"),)), 0.0)
    peers.upsert(PeerInfo("A", "relay", 0, "r0_1", addrs=(_addr(2, "A"),)), 0.0)
    peers.upsert(PeerInfo("B", "relay", 1, "r1_0", addrs=(_addr(3, "B"),)), 0.0)
    wire = SimpleNamespace(me="ME", spawn=lambda fn, *a: spawned.append((fn.__name__, a)))
    host = SimpleNamespace(addrs=[_addr(9, "ME")], on_addrs_changed=None, peer_is_local=lambda p: True,
                           usable_addrs=lambda p, addrs: list(addrs), addrs_for=lambda p: [_addr(9, "ME")],
                           tensor_addr="", note_addrs=lambda p, a: 0)
    return Discovery(wire, peers, host, SimpleNamespace(run_id="run"), {}, on_peer_hello=lambda info: None)


def _hello(stage: int, name: str) -> m.Hello:
    return m.Hello("run", "relay", stage, name, 2, (_addr(7, "FAR"),))


def test_a_far_relay_is_referred_to_its_neighbours_not_greeted(monkeypatch):
    clock = {"t": 100.0}
    monkeypatch.setattr(disc, "now", lambda: clock["t"])
    spawned: list = []
    d = _relay_of_stage_0(spawned)
    d.on_hello("FAR", _hello(2, "r2_0"))
    assert "FAR" not in d.peers and "FAR" not in d.hellos_sent  # not taken in: it works with other stages
    assert len(spawned) == 1
    fn, (to, reply) = spawned[0]
    assert fn == "_answer" and to == "FAR"
    assert [type(x) for x in reply] == [m.PeerList]  # no Hello: the sender is not accepted by a far relay
    named = {a.rsplit("/p2p/", 1)[1] for a in reply[0].addrs}
    assert named == {"D0", "B"}  # the data node and the stage-1 relay (next to stage 2), not the stage-0 one
    d.on_hello("FAR", _hello(2, "r2_0"))  # its next attempt, soon after: not referred again yet
    assert len(spawned) == 1
    clock["t"] += disc.REFER_EVERY_S
    d.on_hello("FAR", _hello(2, "r2_0"))
    assert len(spawned) == 2


def test_a_neighbour_is_greeted_not_referred(monkeypatch):
    monkeypatch.setattr(disc, "now", lambda: 100.0)
    spawned: list = []
    d = _relay_of_stage_0(spawned)
    d.on_hello("NEAR", m.Hello("run", "relay", 1, "r1_1", 2, (_addr(8, "NEAR"),)))
    assert "NEAR" in d.peers
    (fn, (to, reply)), = spawned
    assert isinstance(reply[0], m.Hello)


def test_referrals_remembered_are_bounded(monkeypatch):
    clock = {"t": 0.0}
    monkeypatch.setattr(disc, "now", lambda: clock["t"])
    monkeypatch.setattr(disc, "REFER_KEPT", 8)
    spawned: list = []
    d = _relay_of_stage_0(spawned)
    for i in range(50):
        clock["t"] += disc.REFER_EVERY_S / 4
        d.on_hello(f"FAR{i}", _hello(3, f"r3_{i}"))
    assert len(d._referred) <= 8
    assert len(spawned) == 50
