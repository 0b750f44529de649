"""A relay's crash in the training simulator: the relays that work with it learn of it DETECT_S after it, the other
relays of its stage and the stages next to it IDLE_DETECT_S after it (or DETECT_S after they send it a message), as
the daemon's liveness check watches the relays a relay does not work with loosely (runtime/node/liveness.py)."""

from __future__ import annotations

import pytest

from gwtf_node.runtime.node import liveness
from gwtf_node.sim import train as T
from gwtf_node.sim.train.setting import IDLE_DETECT_S, loose_detect_s


def test_idle_detect_s_is_the_daemons_loose_deadline() -> None:
    assert IDLE_DETECT_S == liveness.LOOSE_DEAD_AFTER_S + liveness.PING_EVERY_S
    assert T.TrainSimOptions().idle_detect_s == IDLE_DETECT_S
    assert T.TrainSimOptions().loose_per_peer_s == T.LOOSE_S_PER_PEER == liveness.LOOSE_S_PER_PEER
    for n in (0, 5, 12, 13, 40):
        assert loose_detect_s(IDLE_DETECT_S, T.LOOSE_S_PER_PEER, n) == liveness.loose_floor_s(n) + liveness.PING_EVERY_S


def _crash_a_relay(idle_s: float, per_peer_s: float = T.LOOSE_S_PER_PEER
                   ) -> tuple[T.TrainSim, str, float, dict[str, list[float]], dict[str, int]]:
    """Table II homogeneous, a relay of stage 1 with flows through it crashes 30 s in; returns the simulator, the relay, the crash time,
    when each node was told (every call of its `peer_gone`) and the relays near it that did not work with it."""
    s = T.make_setting("table2-homogeneous", 0)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0, idle_detect_s=idle_s,
                                          loose_per_peer_s=per_peer_s))
    sim.run(4, until=30.0)
    victim = min(r for r, k in sim.stage.items() if k == 1 and r not in sim.data
                 and any(sim.nodes[r].rec.out.get(d) for d in sim.data))  # (a relay that the flows go through)
    told: dict[str, list[float]] = {}
    for n in sim.nodes:
        real = sim.nodes[n].rec.peer_gone

        def peer_gone(now, gone, _n=n, _real=real):
            if gone == victim:
                told.setdefault(_n, []).append(now)
            return _real(now, gone)
        sim.nodes[n].rec.peer_gone = peer_gone
    t0 = sim.now
    idle = {r: sim._loose_peers(r, victim) for r in sim._idle_watchers(victim)}  # -> the peers it watches loosely
    sim.crash_at(t0, victim)
    sim.run(4, until=t0 + 90.0)
    return sim, victim, t0, told, idle


def test_the_relays_that_do_not_work_with_a_crashed_relay_learn_of_it_later_each_once() -> None:
    sim, victim, t0, told, idle = _crash_a_relay(IDLE_DETECT_S)
    k = sim.stage[victim]
    near = {r for r, s in sim.stage.items() if abs(s - k) <= 1 and r != victim and r not in sim.data}
    assert idle and near - set(idle), (idle, near)  # some work with it, some do not
    late = 0
    for n in sim.nodes:
        if n == victim or n in sim.dead:
            continue
        assert len(told.get(n, [])) == 1, (n, told.get(n))
        (t,) = told[n]
        if n in idle:  # 31 s after, or 7 s after it sent the dead relay a message (then at work)
            assert t0 + T.DETECT_S < t <= t0 + IDLE_DETECT_S + 1e-9, (n, t - t0)
            late += t == pytest.approx(t0 + IDLE_DETECT_S)
        else:
            assert t == pytest.approx(t0 + T.DETECT_S), (n, t - t0)
    assert late > 0


def test_with_idle_detect_s_at_detect_s_every_node_learns_of_it_at_once() -> None:
    sim, victim, t0, told, _idle = _crash_a_relay(T.DETECT_S)
    for n in sim.nodes:
        if n != victim and n not in sim.dead:
            assert told.get(n) == [pytest.approx(t0 + T.DETECT_S)], n


def test_a_watcher_with_many_loose_peers_learns_of_the_crash_after_its_longer_loose_deadline() -> None:
    """Table II has at most 11 loose peers per relay (under the daemon's 12); 5 s per peer makes the scaling show."""
    per_peer = 5.0
    sim, victim, t0, told, idle = _crash_a_relay(IDLE_DETECT_S, per_peer)
    expect = {r: loose_detect_s(IDLE_DETECT_S, per_peer, n) for r, n in idle.items()}
    assert max(expect.values()) > IDLE_DETECT_S, expect
    later = 0
    for r in idle:
        (t,) = told[r]
        assert t0 + T.DETECT_S < t <= t0 + expect[r] + 1e-9, (r, t - t0, expect[r])  # (earlier: it came to work)
        later += expect[r] > IDLE_DETECT_S and t == pytest.approx(t0 + expect[r])
    assert later > 0
