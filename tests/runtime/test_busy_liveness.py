"""Busy is not dead: the liveness deadline's rule, silence counted only while the node's own loop runs, the
event-loop lag probe, and a checkpoint written without holding the GIL.

The swarm that steps for longer than the deadline's floor is in test_busy_swarm.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import trio

from gwtf_node.protocol import messages as m
from gwtf_node.runtime.node import liveness
from gwtf_node.runtime.node.aggregation import RETRY_CAP_S, phase_retry_s
from gwtf_node.runtime.node.liveness import Liveness, dead_after_s
from gwtf_node.runtime.ops.looplag import LoopLag
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place


def test_the_deadline_is_the_floor_for_quick_work_and_scales_with_the_longest_work() -> None:
    floor, factor = liveness.DEAD_AFTER_S, liveness.BUSY_FACTOR
    assert dead_after_s(0.0, 0.0) == floor  # nothing measured yet
    assert dead_after_s(0.02, 0.3) == floor  # a tiny model: crashes found as quickly as ever
    assert dead_after_s(0.0, 15.0) == factor * 15.0  # this node checkpoints for 15 s: so do its stage-mates
    assert dead_after_s(12.0, 1.0) == factor * 12.0  # the peer told a compute of 12 s per microbatch
    assert dead_after_s(1e9, 0.0) == liveness.MAX_DEADLINE_S  # what a peer tells cannot buy it more
    assert dead_after_s(-5.0, -1.0) == floor


def test_phase_signals_are_resent_as_often_as_ever_for_quick_work_and_less_often_for_long_work() -> None:
    from gwtf_node.protocol.phases import RETRY_S

    assert phase_retry_s(0.01) == RETRY_S
    assert phase_retry_s(12.0) == 12.0
    assert phase_retry_s(1000.0) == RETRY_CAP_S


class _Posts:
    """The part of `Wire` the check uses, recording what it sends (no network in this test)."""

    def __init__(self) -> None:
        self.pings: list[str] = []
        self.spawned: list = []

    def post(self, peer: str, msg) -> None:
        assert isinstance(msg, m.Ping)
        self.pings.append(peer)

    def spawn(self, fn, *args) -> None:
        self.spawned.append((fn, args))

    async def disconnect(self, peer: str) -> None:  # pragma: no cover - only spawned
        pass


def _relay_with_a_data_node() -> tuple[Liveness, Peers, list[str], dict[str, float]]:
    peers = Peers("R0", "r0", 2, Place("relay", 0, 4))
    peers.peers["D0"] = PeerInfo("D0", role="data", stage=-1, name="d0")
    dead: list[str] = []
    work = {"s": 0.0}
    lv = Liveness(_Posts(), peers, dead.append, work_s=lambda: work["s"])
    return lv, peers, dead, work


@pytest.mark.trio
async def test_a_relay_of_a_middle_stage_watches_a_data_node_loosely_and_its_stage_mates_as_ever() -> None:
    """Stage 1 of 3: the data node gets the 30-s floor (a Ping after 10 s of silence), a relay of the stage before
    the 6-s floor; relays of the first and last stages watch the data node as before."""
    peers = Peers("R1", "r1", 3, Place("relay", 1, 4))
    peers.peers["D0"] = PeerInfo("D0", role="data", stage=-1, name="d0")
    peers.peers["A"] = PeerInfo("A", role="relay", stage=0, name="a")
    dead: list[str] = []

    def forget(peer: str) -> None:  # (as the node forgets a peer presumed dead)
        dead.append(peer)
        peers.peers.pop(peer)

    lv = Liveness(_Posts(), peers, forget, at_work=lambda: {"A"})  # (A works with it: watched closely)
    peers.heard("D0", 0.0)
    peers.heard("A", 0.0)
    lv.check(0.0)
    assert lv.deadline_s("D0") == liveness.LOOSE_DEAD_AFTER_S and lv.deadline_s("A") == liveness.DEAD_AFTER_S
    for t in range(1, 10):
        lv.check(float(t))
    assert "D0" not in lv.wire.pings and lv.wire.pings.count("A") == 5 and dead == ["A"]
    lv.check(10.0)
    assert lv.wire.pings.count("D0") == 1
    for t in range(11, 31):
        lv.check(float(t))
    assert dead == ["A"]
    lv.check(31.0)
    assert dead == ["A", "D0"]
    for stage in (0, 2):
        edge = Peers("R", "r", 3, Place("relay", stage, 4))
        edge.peers["D0"] = PeerInfo("D0", role="data", stage=-1, name="d0")
        assert Liveness(_Posts(), edge, dead.append).deadline_s("D0") == liveness.DEAD_AFTER_S


@pytest.mark.trio
async def test_a_silent_peer_is_presumed_dead_after_the_floor() -> None:
    lv, peers, dead, _work = _relay_with_a_data_node()
    peers.heard("D0", 0.0)
    for t in range(1, 7):
        lv.check(float(t))
    assert dead == [] and lv.wire.pings.count("D0") == 5  # from 2 s of silence on: a third of its 6-s deadline
    lv.check(7.0)
    assert dead == ["D0"] and "D0" in lv.crashed


@pytest.mark.trio
async def test_a_peer_is_pinged_after_a_third_of_its_deadline_and_a_heard_one_not_at_all() -> None:
    lv, peers, dead, work = _relay_with_a_data_node()
    peers.heard("D0", 0.0)
    lv.check(1.0)
    lv.check(1.9)
    assert lv.wire.pings == []  # heard 1.9 s ago: less than a third of 6 s
    lv.check(2.0)
    assert lv.wire.pings == ["D0"]
    for t in (3.0, 4.0, 5.0):  # it answers each time: heard again, never pinged
        peers.heard("D0", t - 0.5)
        lv.check(t)
    assert lv.wire.pings == ["D0"] and dead == []
    work["s"] = 10.0  # a node whose work takes 10 s: its peers' deadline is 20 s, pinged after 6.7 s of silence
    peers.heard("D0", 10.0)
    for t in range(11, 17):
        lv.check(float(t))
    assert lv.wire.pings == ["D0"]
    lv.check(17.0)
    assert lv.wire.pings == ["D0", "D0"] and dead == []


@pytest.mark.trio
async def test_the_deadline_widens_with_the_work_this_node_measured_and_with_what_the_peer_tells() -> None:
    lv, peers, dead, work = _relay_with_a_data_node()
    peers.heard("D0", 0.0)
    work["s"] = 10.0  # this node's last step (or checkpoint) took 10 s
    for t in range(1, 21):
        lv.check(float(t))
    assert dead == [] and lv.deadline_s("D0") == 20.0
    lv.check(21.0)
    assert dead == ["D0"]

    lv, peers, dead, _work = _relay_with_a_data_node()
    peers.heard("D0", 0.0)
    lv.on_pong("D0", m.Pong(1, compute_ms=9000.0))  # the peer computes 9 s per microbatch
    for t in range(1, 19):
        lv.check(float(t))
    assert dead == [] and lv.deadline_s("D0") == 18.0
    lv.check(19.0)
    assert dead == ["D0"]

    lv, peers, dead, _work = _relay_with_a_data_node()
    peers.heard("D0", 0.0)
    lv.on_pong("D0", m.Pong(1, compute_ms=5.0, busy_ms=12_000.0))  # its event loop once ran 12 s late
    for t in range(1, 25):
        lv.check(float(t))
    assert dead == [] and lv.deadline_s("D0") == 24.0
    lv.check(25.0)
    assert dead == ["D0"]


def test_a_pong_tells_this_nodes_compute_and_its_longest_work_or_lag() -> None:
    lv, _peers, _dead, work = _relay_with_a_data_node()
    lv.compute_ms = lambda: 7.5
    work["s"] = 3.0
    assert lv.pong(42) == m.Pong(42, 7.5, 3000.0)
    lv.lag.max_lag_s = 4.25  # the loop once woke 4.25 s late: longer than any work
    assert lv.pong(43) == m.Pong(43, 7.5, 4250.0)
    lv.lag.max_lag_s = 1e9  # bounded by the deadline's ceiling, as a receiver bounds it
    assert lv.pong(44).busy_ms == liveness.MAX_DEADLINE_S * 1000.0


@pytest.mark.trio
async def test_silence_counts_only_while_this_nodes_own_loop_ran(caplog) -> None:
    lv, peers, dead, _work = _relay_with_a_data_node()
    peers.heard("D0", 0.0)
    lv.check(1.0)
    lv.check(2.0)
    with caplog.at_level(logging.INFO, logger="gwtf.node"):
        lv.check(25.0)  # this node's loop was held for 22 s: the peer's frames wait unread in the sockets
    assert dead == [] and "loop was held" in caplog.text
    for t in range(26, 32):
        lv.check(float(t))
    assert dead == []  # the floor, counted from when the loop came back
    lv.check(32.0)
    assert dead == ["D0"]  # ... and still dead after it when it stays silent


@pytest.mark.trio
async def test_the_lag_probe_measures_a_blocked_loop_and_names_the_step_that_blocked_it(caplog) -> None:
    lag = LoopLag()
    with caplog.at_level(logging.WARNING, logger="gwtf.node"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lag.loop)
            await trio.sleep(0.3)
            time.sleep(1.5)  # the event loop's thread held, as torch work in it would hold it
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    snap = lag.snapshot()
    assert snap["stalls"] >= 1 and snap["max_lag_s"] >= 1.0 and snap["max_step_s"] >= 1.0
    assert "event loop stalled" in caplog.text and "test_the_lag_probe" in caplog.text


def test_a_checkpoint_holds_the_state_as_a_tensor_that_torch_writes_without_the_gil(tmp_path: Path) -> None:
    """The state goes into the file as a uint8 tensor (torch copies a tensor's bytes into the file with the GIL
    released; a `bytes` object is pickled, copied and CRC'd in one call that holds it); a file holding the state
    as `bytes` still reads the same."""
    import torch

    from gwtf_node.runtime.node import checkpoints

    state = bytes(range(256)) * 4096
    path = checkpoints.write(tmp_path, run_id="r", role="relay", stage=0, steps=1, state=state, params_sha256="x",
                             params=torch.zeros(8))
    rec = torch.load(path, weights_only=True)
    assert isinstance(rec["state"], torch.Tensor) and rec["state"].dtype == torch.uint8
    ck = checkpoints.load(tmp_path / "checkpoint.pt")
    assert ck.state == state and ck.steps == 1

    rec["state"] = state  # as written before
    torch.save(rec, path)
    assert checkpoints.load(path).state == state


@pytest.mark.trio
async def test_the_deadline_widens_with_the_round_trips_of_the_peers_pings(monkeypatch) -> None:
    lv, peers, dead, _work = _relay_with_a_data_node()
    clock = {"t": 0.0}
    monkeypatch.setattr(liveness, "now", lambda: clock["t"])
    peers.heard("D0", 0.0)
    lv.check(1.0)
    lv.check(2.0)  # silent for 2 s: pinged
    assert lv.wire.pings == ["D0"] and lv.deadline_s("D0") == liveness.DEAD_AFTER_S
    (nonce,) = lv.pinged["D0"]
    lv.check(3.0)
    lv.check(4.0)  # pinged again, each Ping timed
    assert len(lv.pinged["D0"]) == 3
    clock["t"] = 5.0  # its Pong comes 3 s later (a loaded machine): the first sample, rttvar half of it
    lv.on_pong("D0", m.Pong(nonce))
    assert lv.deadline_s("D0") == pytest.approx(liveness.RTT_FACTOR * (3.0 + 4 * 1.5))  # 27 s
    peers.heard("D0", 5.0)
    for t in range(5, 33):
        lv.check(float(t))
    assert dead == []  # 27 s of silence
    lv.check(33.0)
    assert dead == ["D0"] and "D0" not in lv.pinged  # a crash is still found, after the round trips' deadline
    lv.on_pong("D0", m.Pong(12345))  # a Pong to no Ping of ours (a LinkProbe's, or forged): times nothing
    assert lv.round_trips["D0"].srtt == 3.0
    peers.peers["D1"] = PeerInfo("D1", role="data", stage=-1, name="d1")
    assert lv.deadline_s("D1") == lv.deadline_s("D0")  # a peer not timed yet: the slowest timed peer's timeout


def test_round_trips_are_smoothed_as_tcp_smooths_them() -> None:
    r = liveness.RoundTrips(0.1)
    assert (r.srtt, r.rttvar) == (0.1, 0.05)
    r.add(0.1)
    assert r.srtt == pytest.approx(0.1) and r.rttvar == pytest.approx(0.0375)
    for _ in range(50):
        r.add(0.1)
    assert r.rto_s() == pytest.approx(0.1, abs=1e-6)  # a steady round trip: the deadline's floor rules
    r.add(2.0)  # one round trip of 2 s: the timeout moves up by most of it at once (the variance)
    assert 2.0 < r.rto_s() < 2.3


@pytest.mark.trio
async def test_the_phase_waits_are_bounded_by_the_phase_work_measured_here_an_all_reduce_included(autojump_clock):
    """Over a slow uplink an all-reduce takes minutes, and every wait of the phase spans one (a relay's step, a data
    node's CAN TAKE): once a node measured it, its waits are not overdue at WAIT_BOUND_S (a WARNING every
    iteration, BEGIN sent again to relays still summing), but at 10x what the phase took here."""
    from types import SimpleNamespace

    from gwtf_node.protocol.phases import OpenIteration, Phases
    from gwtf_node.protocol.phasewaits import WAIT_BOUND_S
    from gwtf_node.runtime.net.wire import now
    from gwtf_node.runtime.node.aggregation import Aggregation

    ag = Aggregation.__new__(Aggregation)
    ag.stage = SimpleNamespace(busiest_s=lambda: 0.4)  # a microbatch's compute, a quick step
    ag.phase_work_s, ag._stepped, ag.phases = {}, None, None
    ag.iteration_opened = ag.on_open = lambda it: None
    assert ag.wait_bound_s() == WAIT_BOUND_S
    ag.phases = Phases("d", -1, 1, wait_bound_s=ag.wait_bound_s())
    ag._stepped = (4, now())  # the data node's step of iteration 4 ...
    await trio.sleep(95.0)  # ... and the relays' all-reduce over 10 Mbit/s
    ag._opened(OpenIteration(5))  # CAN TAKE came back
    assert ag.phase_work_s == {"can_take": pytest.approx(95.0)}
    assert ag.phases.wait_bound_s == pytest.approx(950.0)  # the phase's bound follows it at once
    ag._phase_work("aggregation", 120.0)  # a relay: its step with a 2-minute all-reduce
    assert ag.wait_bound_s() == ag.phases.wait_bound_s == pytest.approx(1200.0)
    ag.phase_work_s = {"aggregation": 1.0}  # a fast link again: the bound comes back down
    assert ag.wait_bound_s() == WAIT_BOUND_S
