"""Crash recovery of microbatches (protocol/recovery.py) in the training simulator (sim/train.py).

Each scenario crashes one relay at a given point of the protocol, found by
watching the machines' events, then checks the ledger: every microbatch is
completed exactly once, or deferred and completed later; none is lost; no
iteration stalls.  The last tests crash the elected leader (3 data nodes);
tests/sim/test_sim_phases.py crashes it around BEGIN AGGREGATION.
"""

from __future__ import annotations

import pytest

from gwtf_node.protocol.messages import Backward, BeginAggregation, Forward
from gwtf_node.protocol.pipeline import MbStatus
from gwtf_node.sim import train as T

ITERS = 3


def crash_when(sim: T.TrainSim, when, victim_of) -> None:
    """Crash `victim_of(node, payload)` (once) as soon as `when(node, event, payload)` holds; events are a
    message arriving ("msg", (sender, msg)) and a computation done ("done", (key, kind))."""
    sim.fired = False

    def observe(nid, event, payload):
        if not sim.fired and when(nid, event, payload):
            sim.fired = True
            victim = victim_of(nid, payload)
            if victim is not None:
                sim.crash_at(sim.now, victim)

    sim.observer = observe


def run(policy: str, when, victim_of=lambda nid, p: nid, setting="table2-homogeneous", seed=0):
    s = T.make_setting(setting, seed)
    sim = T.TrainSim(s, T.TrainSimOptions(policy=policy, churn=0.0, seed=seed))
    crash_when(sim, when, victim_of)
    sim.run(ITERS)
    return sim, sim.report(ITERS)


def check_ledger(sim: T.TrainSim, rep: dict) -> None:
    assert sim.fired, "the crash point was never reached"
    assert rep["unfinished_iterations"] == 0
    assert rep["lost_microbatches"] == 0
    for d in T.DATA_NODES:
        led = sim.nodes[d].rec.ledger
        done = led.completed_everywhere()
        assert len(done) == len(set(done)), "a microbatch was trained twice"
        added: dict[int, int] = {}
        for it, row in led.entries.items():
            c = led.counts(it)
            assert sum(c.values()) == len(row)
            for seq, st in row.items():
                added[seq] = added.get(seq, 0) + 1
                if it < ITERS:
                    assert st in (MbStatus.COMPLETED, MbStatus.DEFERRED)
        for seq, n in added.items():  # deferred n-1 times, then completed (or still waiting in the open iteration)
            statuses = [led.entries[it][seq] for it in sorted(led.entries) if seq in led.entries[it]]
            assert all(st is MbStatus.DEFERRED for st in statuses[:-1])


def relay(nid: str) -> bool:
    return nid not in T.DATA_NODES


def stage_of(nid: str) -> int:
    return int(nid[1]) if relay(nid) else -1


# crash points: (name, when(node, event, payload) -> crash now?, who crashes)
POINTS = {
    # the stage-2 relay that is about to receive a microbatch dies first: its upstream times out
    "before_forward": (lambda n, e, p: relay(n) and stage_of(n) == 1 and e == "done" and p[1] == "forward"
                       and p[0][2] == 1, lambda n, p: None),
    # a relay dies right when a Forward reaches it (it never computes)
    "during_forward": (lambda n, e, p: relay(n) and stage_of(n) == 2 and e == "msg" and type(p[1]) is Forward
                       and p[1].iteration == 1, lambda n, p: n),
    # a relay dies after its forward is done and passed on, before the backward comes back
    "between_forward_and_backward": (lambda n, e, p: relay(n) and stage_of(n) == 2 and e == "done"
                                     and p[1] == "forward" and p[0][2] == 1, lambda n, p: n),
    # a relay dies while it computes a backward
    "during_backward": (lambda n, e, p: relay(n) and stage_of(n) == 3 and e == "msg" and type(p[1]) is Backward
                        and p[1].iteration == 1, lambda n, p: n),
    # a relay dies when BEGIN AGGREGATION reaches it (its gradient contributions die with it)
    "during_aggregation": (lambda n, e, p: relay(n) and stage_of(n) == 2 and e == "msg"
                           and type(p[1]) is BeginAggregation and p[1].iteration == 1, lambda n, p: n),
}


def _victim(name):
    when, who = POINTS[name]
    if name == "before_forward":
        # the next hop chosen by the stage-1 relay: crash the cheapest stage-2 relay
        return when, (lambda n, p: "s2r0")
    return when, who


@pytest.mark.parametrize("policy", ["gwtf", "swarm"])
@pytest.mark.parametrize("name", list(POINTS))
def test_crash_point_loses_nothing(name: str, policy: str) -> None:
    when, who = _victim(name)
    sim, rep = run(policy, when, who)
    check_ledger(sim, rep)
    assert len(sim.crashes) == 1


def test_gwtf_recovers_a_backward_without_restart_and_swarm_restarts() -> None:
    when, who = _victim("between_forward_and_backward")
    g, grep_ = run("gwtf", when, who)
    s, srep = run("swarm", when, who)
    check_ledger(g, grep_)
    check_ledger(s, srep)
    assert grep_["protocol"]["recovers"] >= 1 and grep_["protocol"]["restarts"] == 0
    assert srep["protocol"]["restarts"] >= 1
    # SWARM recomputed the whole pipeline: more wasted compute than GWTF's one recomputed stage
    assert srep["wasted_compute_s"] > grep_["wasted_compute_s"]


def test_lost_contributions_are_counted() -> None:
    when, who = _victim("during_aggregation")
    sim, rep = run("gwtf", when, who)
    check_ledger(sim, rep)
    assert rep["lost_contributions"] >= 1


def test_no_churn_no_waste_both_policies() -> None:
    for policy in ("gwtf", "swarm"):
        rep = T.run_train("table2-homogeneous", policy, 0.0, 2, 0)
        assert rep["lost_microbatches"] == 0 and rep["throughput_per_iteration"] == 8
        assert rep["wasted_compute_s"] < 1e-6


def test_churn_runs_lose_nothing() -> None:
    for setting in T.SETTINGS:
        rep = T.run_train(setting, "gwtf", 0.1, 8, 2)
        assert rep["lost_microbatches"] == 0 and rep["unfinished_iterations"] == 0


# ---- property: any crash schedule, exactly-once completion and a consistent ledger ---------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

RELAYS = [f"s{s}r{i}" for s, n in enumerate(T.STAGE_SIZES) for i in range(n)]


def check_exactly_once(sim: T.TrainSim, iters: int) -> None:
    """Every ledger entry of a closed iteration is COMPLETED or DEFERRED; a deferred seq comes back in the
    next iteration; every seq is completed at most once; no microbatch record is left at its data node."""
    for d in T.DATA_NODES:
        led = sim.nodes[d].rec.ledger
        done = led.completed_everywhere()
        assert len(done) == len(set(done)), "a microbatch was trained twice"
        for it in range(iters):
            row = led.entries[it]
            for seq, status in row.items():
                assert status in (MbStatus.COMPLETED, MbStatus.DEFERRED), (d, it, seq, status)
                if status is MbStatus.DEFERRED:
                    assert seq in led.entries.get(it + 1, {}), "a deferred microbatch was not pushed again"
        assert not [k for k in sim.nodes[d].rec.mbs if k[2] < iters], "a closed iteration left a record in flight"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["gwtf", "swarm"]), setting=st.sampled_from(T.SETTINGS),
       crashes=st.lists(st.tuples(st.floats(0.0, 900.0), st.sampled_from(RELAYS)), min_size=1, max_size=6),
       rejoin=st.booleans())
def test_random_crash_schedules_lose_nothing(policy, setting, crashes, rejoin) -> None:
    iters = 4
    s = T.make_setting(setting, 3)
    sim = T.TrainSim(s, T.TrainSimOptions(policy=policy, churn=0.0, seed=3, crash_plan=crashes, rejoin=rejoin))
    sim.run(iters)
    rep = sim.report(iters)
    assert rep["unfinished_iterations"] == 0 and rep["lost_microbatches"] == 0
    check_exactly_once(sim, iters)


def test_simultaneous_crashes_of_consecutive_stages_are_repaired_without_restart() -> None:
    """Two adjacent stages of the same path die at once in the backward pass: one repair chain fixes both."""
    fired = {}

    def when(n, e, p):
        return n == "d0" and e == "done" and p[1] == "loss" and p[0][2] == 1

    def victims(n, p):
        path = sim_holder["sim"].nodes["d0"].rec.mbs[p[0]].path
        fired["path"] = list(path)
        for v in path[1:3]:
            sim_holder["sim"].crash_at(sim_holder["sim"].now, v)
        return path[3]

    sim_holder = {}
    s = T.make_setting("table2-homogeneous", 0)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0))
    sim_holder["sim"] = sim
    crash_when(sim, when, victims)
    sim.run(ITERS)
    rep = sim.report(ITERS)
    check_ledger(sim, rep)
    assert len(sim.crashes) == 3
    assert rep["protocol"]["recovers"] >= 3 and rep["protocol"]["restarts"] == 0
    check_exactly_once(sim, ITERS)


@pytest.mark.parametrize("policy", ["gwtf", "swarm"])
@pytest.mark.parametrize("moment", ["forward", "loss", "aggregation"])
def test_leader_data_node_crash(policy: str, moment: str) -> None:
    """The elected leader (one of 3 data nodes) crashes in iteration 1: in its forward pass, at its loss, or
    when its aggregation begins.  Its microbatches die with it (relays drop them and their gradients); the
    other two elect a leader and training goes on: every later iteration completes their microbatches,
    nothing of theirs is lost, no iteration stalls."""
    iters = 4
    s = T.make_setting("table2-homogeneous", 0, data_nodes=3)
    sim = T.TrainSim(s, T.TrainSimOptions(policy=policy, churn=0.0, seed=0))
    when = {
        "forward": lambda n, e, p: sim._leading(n) and e == "done" and p[1] == "forward" and p[0][2] == 1,
        "loss": lambda n, e, p: sim._leading(n) and e == "done" and p[1] == "loss" and p[0][2] == 1,
        "aggregation": lambda n, e, p: relay(n) and e == "msg" and type(p[1]) is BeginAggregation
        and p[1].iteration == 1,
    }[moment]
    leader = {}

    def victim(n, p):
        leader["id"] = next(d for d in sim.data if sim._leading(d))
        return leader["id"]

    crash_when(sim, when, victim)
    sim.run(iters)
    rep = sim.report(iters)
    assert sim.fired and sim.crashes[0][1] == leader["id"]
    assert rep["unfinished_iterations"] == 0, rep
    assert rep["lost_microbatches"] == 0, rep
    rest = [d for d in sim.data if d != leader["id"]]
    assert any(sim._leading(d) for d in rest)
    for d in rest:
        assert sim.nodes[d].rec.iteration >= iters
        for it in range(iters):
            c = sim.nodes[d].rec.ledger.counts(it)
            assert c["pending"] == c["inflight"] == 0, (it, c)
    for nid, n in sim.nodes.items():  # nobody still holds a microbatch of the dead data node
        if nid not in sim.dead and relay(nid):
            assert not [k for k in n.rec.mbs if k[0] == leader["id"]], nid
