"""Watching follows the work (runtime/node/liveness.py): a relay watches the relays it works with closely (a Ping
after 2 s of silence, dead after 6 s) and the other relays of its stage and the stages next to it loosely (10 s,
30 s); one that comes to work has its silence counted, for the Ping and the close deadline, only from then."""

from __future__ import annotations

import pytest

from gwtf_node.protocol import messages as m
from gwtf_node.runtime.node import liveness
from gwtf_node.runtime.node.liveness import Liveness
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place


class _Posts:
    """The part of `Wire` the check uses, recording the Pings it posts (no network here)."""

    def __init__(self) -> None:
        self.pings: list[str] = []

    def post(self, peer: str, msg) -> None:
        assert isinstance(msg, m.Ping)
        self.pings.append(peer)

    def spawn(self, fn, *args) -> None:
        pass

    async def disconnect(self, peer: str) -> None:  # pragma: no cover - only spawned
        pass


def _relay(role: str = "relay", stage: int = 1) -> tuple[Liveness, Peers, list[str], set[str]]:
    """A node of stage `stage` of 3 with relays A (stage 0), B (its own stage), C (stage 2) and a data node; `work`
    is what it works with (the node's `at_work`)."""
    peers = Peers("R", "r", 3, Place(role, stage, 4))
    for pid, k in (("A", 0), ("B", 1), ("C", 2)):
        peers.peers[pid] = PeerInfo(pid, role="relay", stage=k, name=pid.lower())
    peers.peers["D"] = PeerInfo("D", role="data", stage=-1, name="d")
    dead: list[str] = []

    def forget(peer: str) -> None:
        dead.append(peer)
        peers.peers.pop(peer)

    work: set[str] = set()
    lv = Liveness(_Posts(), peers, forget, at_work=lambda: set(work))
    for pid in ("A", "B", "C", "D"):
        peers.heard(pid, 0.0)
    return lv, peers, dead, work


@pytest.mark.trio
async def test_relays_it_does_not_work_with_are_pinged_after_10_s_of_silence_and_presumed_dead_after_30() -> None:
    lv, peers, dead, work = _relay()
    work.add("A")  # A's units flow through this relay
    for t in range(0, 10):
        lv.check(float(t))
    assert lv.deadline_s("A") == liveness.DEAD_AFTER_S and dead == ["A"]  # silent 7 s: dead
    assert lv.deadline_s("B") == lv.deadline_s("C") == liveness.LOOSE_DEAD_AFTER_S
    assert "B" not in lv.wire.pings and "C" not in lv.wire.pings
    lv.check(10.0)
    assert lv.wire.pings.count("B") == lv.wire.pings.count("C") == 1
    for t in range(11, 31):
        peers.heard("C", float(t))  # C and the data node answer; B does not
        peers.heard("D", float(t))
        lv.check(float(t))
    assert dead == ["A"]
    lv.check(31.0)
    assert dead == ["A", "B"]


@pytest.mark.trio
async def test_a_relay_that_comes_to_work_is_pinged_after_a_close_third_and_has_the_close_deadline_only_from_then() -> None:
    lv, peers, dead, work = _relay()
    for t in range(0, 9):
        lv.check(float(t))
    assert lv.wire.pings == [] and dead == []
    work.add("C")  # a microbatch goes to C now, which has been silent for 9 s (a loose third: not yet pinged)
    lv.check(9.0)
    assert lv.wire.pings == [] and lv.deadline_s("C") == liveness.DEAD_AFTER_S and dead == []
    lv.check(10.0)
    assert "C" not in lv.wire.pings  # watched closely for 1 s: its silence counts from then, for the Ping too
    lv.check(11.0)
    assert lv.wire.pings.count("C") == 1  # a third of the close deadline
    for t in range(12, 16):
        lv.check(float(t))
    assert dead == []  # silent 15 s, but watched closely only for 6
    lv.check(16.0)
    assert dead == ["C"]


@pytest.mark.trio
async def test_stage_mates_heard_in_an_aggregation_are_not_pinged_at_its_start() -> None:
    """An aggregation's group is watched closely from its start (phasewaits.py `peers_at_work`); stage-mates silent
    since the last aggregation are heard in its all-reduce within moments, so none gets a Ping."""
    lv, peers, dead, work = _relay()
    for t in range(0, 20):
        lv.check(float(t))
    work.add("B")  # the aggregation begins: B, silent for 20 s, is watched closely
    before = len(lv.wire.pings)
    lv.check(20.0)
    peers.heard("B", 21.5)  # its all-reduce chunk
    for t in range(21, 23):
        lv.check(float(t))
    work.clear()  # stepped
    lv.check(23.0)
    assert "B" not in lv.wire.pings[before:] and dead == []


@pytest.mark.trio
async def test_an_answering_relay_at_work_stays_and_one_that_leaves_work_goes_back_to_the_loose_floor() -> None:
    lv, peers, dead, work = _relay()
    work.add("B")
    lv.check(0.0)
    for t in range(1, 20):
        peers.heard("B", t - 0.5)
        lv.check(float(t))
    assert dead == [] and lv.close_since == {"B": 0.0}
    work.clear()
    lv.check(20.0)
    assert lv.close_since == {} and lv.deadline_s("B") == liveness.LOOSE_DEAD_AFTER_S
    work.add("B")
    lv.check(21.0)
    assert lv.close_since == {"B": 21.0}


@pytest.mark.trio
async def test_a_data_node_watches_the_relays_of_the_edge_stages_closely_and_they_watch_it_as_ever() -> None:
    lv, peers, dead, work = _relay(role="data", stage=-1)
    peers.peers["A"] = PeerInfo("A", role="relay", stage=0, name="a")
    peers.peers["C"] = PeerInfo("C", role="relay", stage=2, name="c")
    lv.check(0.0)
    assert all(lv.deadline_s(p) == liveness.DEAD_AFTER_S for p in peers.watched())
    edge, _peers, _dead, _work = _relay(stage=0)
    edge.check(0.0)
    assert edge.deadline_s("D") == liveness.DEAD_AFTER_S and edge.deadline_s("B") == liveness.LOOSE_DEAD_AFTER_S


@pytest.mark.trio
async def test_a_relay_whose_connection_closed_is_watched_closely_until_it_is_heard_again(monkeypatch) -> None:
    clock = {"t": 0.0}
    monkeypatch.setattr(liveness, "now", lambda: clock["t"])
    lv, peers, dead, work = _relay()
    for t in range(0, 5):
        peers.heard("C", min(t, 2.0))
        lv.check(float(t))
    clock["t"] = 5.0
    lv.connection_lost("B")  # B's process ended: its connections closed
    lv.connection_lost("C")  # C's closed too, but C is alive: its Pong comes
    lv.connection_lost("D")  # the data node's closed: a middle relay watches it loosely all the same
    lv.check(5.0)
    assert set(lv.wire.pings) == {"B", "C"} and lv.deadline_s("B") == liveness.DEAD_AFTER_S
    assert lv.deadline_s("D") == liveness.LOOSE_DEAD_AFTER_S
    peers.heard("C", 5.5)
    for t in range(6, 11):
        lv.check(float(t))
    assert dead == [] and lv.deadline_s("C") == liveness.LOOSE_DEAD_AFTER_S and "C" not in lv.lost_at
    lv.check(11.0)
    assert dead == []  # watched closely for 6 s, no more yet
    lv.check(12.0)
    assert dead == ["B"]


@pytest.mark.trio
async def test_the_loose_floor_grows_with_the_peers_watched_loosely_so_that_the_loose_pings_do_not() -> None:
    lv, peers, dead, work = _relay()
    lv.check(0.0)
    assert lv.loose_peers == 4 and lv.deadline_s("B") == lv.deadline_s("D") == liveness.LOOSE_DEAD_AFTER_S
    for i in range(21):  # a big swarm: 7 more relays in each of the three stages near this one
        peers.peers[f"X{i}"] = PeerInfo(f"X{i}", role="relay", stage=i % 3, name=f"x{i}")
        peers.heard(f"X{i}", 0.0)
    work.add("A")  # ... one of which it works with: watched closely, not counted
    lv.check(1.0)
    assert lv.loose_peers == 24
    assert lv.deadline_s("B") == lv.deadline_s("D") == pytest.approx(liveness.LOOSE_S_PER_PEER * 24)  # 60 s
    assert lv.deadline_s("A") == liveness.DEAD_AFTER_S
    assert liveness.loose_floor_s(12) == liveness.LOOSE_DEAD_AFTER_S  # up to 12 loose peers: the 30 s floor
    for t in range(2, 19):
        peers.heard("A", float(t))
        lv.check(float(t))
    assert set(lv.wire.pings) <= {"A"}  # no loose peer pinged after 18 s of silence (the 30 s floor pings after 10) ...
    lv.check(20.0)
    loose = sorted(p for p in lv.wire.pings if p != "A")  # (A, at work, is watched closely)
    assert loose == sorted(["B", "C", "D", *(f"X{i}" for i in range(21))]) and dead == []
    for t in range(21, 61):
        peers.heard("A", float(t))
        lv.check(float(t))
    assert dead == []
    lv.check(61.0)
    assert sorted(dead) == sorted(["B", "C", "D", *(f"X{i}" for i in range(21))])


@pytest.mark.trio
async def test_a_relay_whose_connection_opened_again_is_watched_loosely_again(monkeypatch) -> None:
    """A connection that closed while both ends live (closed as stale by a busy end, reset under load): once a new
    one opens (its process answered the handshake), the peer is no longer watched closely for the lost one."""
    clock = {"t": 0.0}
    monkeypatch.setattr(liveness, "now", lambda: clock["t"])
    lv, peers, dead, work = _relay()
    lv.check(0.0)
    clock["t"] = 1.0
    lv.connection_lost("B")
    lv.connection_lost("C")
    lv.check(1.0)
    assert lv.deadline_s("B") == lv.deadline_s("C") == liveness.DEAD_AFTER_S
    lv.connection_back("C")  # a dial to C succeeded; B's process is gone: a dial to it is refused
    for t in range(2, 9):
        lv.check(float(t))
    assert dead == ["B"] and lv.deadline_s("C") == liveness.LOOSE_DEAD_AFTER_S
