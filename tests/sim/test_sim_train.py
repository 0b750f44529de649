"""The churn simulator (sim/train.py) and the recovery behaviours behind docs/bench_churn.md.

Regression tests for the causes found in the churn benchmark (see the
"Causes" section of docs/bench_churn.md): a recovery that found every
stage-0 relay full waited for the data node's watchdog (iterations of
3,000+ s), a relay that regained a route never told its upstream, a stage
with no live relay made microbatches bounce or wait for the watchdog, and a
whole stage lost mid-iteration deferred every microbatch although joiners
were ready before the iteration ended.
"""

from __future__ import annotations

import collections
import random

import pytest

from gwtf_node.protocol.flow import FORMED_WAIT_S
from gwtf_node.protocol.messages import Backward, Complete, Forward
from gwtf_node.protocol.recovery import Compute, MbTimer, RecoveryConfig, RecoveryNode, TimerKind
from gwtf_node.sim import train as T


def test_a_recovery_with_every_stage0_relay_full_does_not_stall_the_iteration() -> None:
    """Seed 3, heterogeneous, 10% churn: a Recover that finds no stage-0 relay with room is retried when a slot
    frees, and a probe round presumes dead the stage-0 holder that failed, not the live relay that denied the
    Recover (else no first hop is left and six watchdog rounds, ~2,900 s, pass before the microbatch is given up)."""
    rep = T.run_train("table2-heterogeneous", "gwtf", 0.1, 25, 3)
    assert rep["lost_microbatches"] == 0 and rep["unfinished_iterations"] == 0
    assert max(p["iteration_s"] for p in rep["per_iteration"] if p["finished"]) < 1500
    assert rep["protocol"]["gave_up"] == 0


@pytest.mark.parametrize("policy", ["gwtf", "swarm"])
def test_a_stage_dead_for_good_defers_quickly(policy: str) -> None:
    """Every stage-1 relay dies at once and none comes back: the microbatches are deferred, iteration after
    iteration, without stalling (found by Hypothesis: parked microbatches used to wait for six watchdog rounds
    per iteration and the run hit the simulator's time limit)."""
    s = T.make_setting("table2-homogeneous", 7)
    # (pause_empty=False: the daemon pauses instead, tests/sim/test_sim_pausing_rules.py)
    sim = T.TrainSim(s, T.TrainSimOptions(policy=policy, churn=0.0, seed=7,
                                         crash_plan=[(0.0, "s1r0"), (0.0, "s1r1"), (0.0, "s1r2")], rejoin=False,
                                         pause_empty=False))
    sim.run(4)
    rep = sim.report(4)
    assert rep["unfinished_iterations"] == 0 and rep["lost_microbatches"] == 0
    assert sim.now < 4 * 1200


@pytest.mark.parametrize("policy", ["gwtf", "swarm"])
def test_joiners_mid_iteration_save_a_stage_lost_mid_iteration(policy: str) -> None:
    """The older joining model (`joining="restart"`): all of stage 2 dies in iteration 1, the joiners come back
    in it when their download finishes, the parked microbatches go on, nothing is deferred.  (The daemon's
    joining has no state to hand over then: test_sim_parity.py.)"""
    s = T.make_setting("table2-homogeneous", 0)
    sim = T.TrainSim(s, T.TrainSimOptions(policy=policy, churn=0.0, seed=0,
                                         crash_plan=[(150.0, "s2r0"), (150.0, "s2r1"), (150.0, "s2r2")],
                                         joining="restart"))
    sim.run(4)
    rep = sim.report(4)
    assert rep["lost_microbatches"] == 0 and rep["deferred_microbatches"] == 0
    assert [p["completed"] for p in rep["per_iteration"]] == [8, 8, 8, 8]
    assert sim.joins == 3
    # the same crashes with joiners admitted only at the next open: the iteration's microbatches are deferred
    sim2 = T.TrainSim(s, T.TrainSimOptions(policy=policy, churn=0.0, seed=0,
                                          crash_plan=[(150.0, "s2r0"), (150.0, "s2r1"), (150.0, "s2r2")],
                                          joining="restart", join_mid_iteration=False))
    sim2.run(4)
    rep2 = sim2.report(4)
    assert rep2["lost_microbatches"] == 0 and rep2["deferred_microbatches"] > 0


def test_gwtf_data_node_never_recomputes_its_embedding_side() -> None:
    """A microbatch put back (no first hop with room) keeps the data node's output: one embedding forward per
    microbatch (it used to be recomputed at every relaunch)."""
    s = T.make_setting("table2-heterogeneous", 0)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.1, seed=0))
    sim.trace = []
    sim.run(25)
    fwd = collections.Counter(e[5] for e in sim.trace
                              if e[0] == "compute" and e[3] in T.DATA_NODES and e[4] == "forward")
    assert fwd and max(fwd.values()) == 1


def _relay(capacity: int = 2) -> RecoveryNode:
    cfg = RecoveryConfig(node_id="r", stage=1, last_stage=3, capacity=capacity, data_nodes=("d",), next_peers={"n": 1.0}, prev_peers={"p": 1.0}, peer_capacity={"n": 1},
                         prior_s={"n": 5.0, "p": 5.0})
    return RecoveryNode(cfg, random.Random(0))


def _sends(eff, kind):
    return [e for e in eff if type(getattr(e, "msg", None)) is kind]


def test_a_relay_parks_its_output_when_the_next_stage_is_full_and_goes_on_when_a_slot_frees() -> None:
    m = _relay()
    k1, k2 = ("d", 1, 0), ("d", 2, 0)
    m.on_message(0.0, "p", Forward(*k1, ("d", "p"), None, 0))
    eff = m.on_compute_done(1.0, k1, "forward")
    assert [e.to for e in _sends(eff, Forward)] == ["n"]
    m.on_message(2.0, "n", Complete(*k1, 0))
    m.on_message(3.0, "p", Forward(*k2, ("d", "p"), None, 0))
    eff = m.on_compute_done(4.0, k2, "forward")
    assert not _sends(eff, Forward)  # n holds k1 and has one slot: k2 waits here, with its output
    assert m.mbs[k2].parked and m.mbs[k2].phase == "sent"
    assert not [e for e in eff if type(getattr(e, "msg", None)).__name__ == "MbDeny"]
    m.on_message(10.0, "n", Backward(*k1, None, 0))  # k1's backward: it leaves n ...
    eff = m.on_compute_done(11.0, k1, "backward")  # ... and my slot at n frees: k2 goes on
    assert [e.to for e in _sends(eff, Forward)] == ["n"]
    assert not m.mbs[k2].parked


def test_a_parked_relay_gives_up_once_its_deadline_passed() -> None:
    m = _relay()
    k1, k2 = ("d", 1, 0), ("d", 2, 0)
    m.on_message(0.0, "p", Forward(*k1, ("d", "p"), None, 0))
    m.on_compute_done(1.0, k1, "forward")
    m.on_message(2.0, "n", Complete(*k1, 0))
    m.on_message(3.0, "p", Forward(*k2, ("d", "p"), None, 0))
    eff = m.on_compute_done(4.0, k2, "forward")
    (timer,) = [e for e in eff if isinstance(getattr(e, "key", None), MbTimer) and e.key.kind is TimerKind.FW]
    eff = m.on_timer(timer.deadline, timer.key)
    # one more try (n still holds k1): then the microbatch is denied upstream, as without parking
    assert [e.to for e in eff if type(getattr(e, "msg", None)).__name__ == "MbDeny"] == ["p"]
    assert k2 not in m.mbs


def test_set_flows_during_training_lets_a_data_node_launch() -> None:
    cfg = RecoveryConfig(node_id="d", stage=-1, last_stage=1, capacity=2, data_nodes=("d",), next_peers={"a": 1.0}, prev_peers={"b": 1.0}, peer_capacity={"a": 2})
    m = RecoveryNode(cfg, random.Random(0))
    m.set_flows({"d": {"a": 1}})
    eff = m.start(0.0)
    assert len([e for e in eff if type(e) is Compute]) == 1  # one unit: one microbatch in flight
    eff = m.set_flows({"d": {"a": 2}}, now=1.0)
    assert len([e for e in eff if type(e) is Compute]) == 1  # a second unit: the second one goes


@pytest.mark.parametrize("option", [{"routing": "oracle"}, {"routing": "oracle", "reflow": False}, {"detect": False},
                                    {"joining": "restart"}, {"joining": "restart", "join_mid_iteration": False},
                                    {"priors": "modelled"},
                                    {"swarm_reacts_to": "timeouts"}, {"gwtf_acts_on_gone": False},
                                    {"unpresume": False}, {"can_take": "any"}])
def test_model_switches_lose_nothing(option: dict) -> None:
    for policy in ("gwtf", "swarm"):
        rep = T.run_train("table2-heterogeneous", policy, 0.2, 8, 1, **option)
        assert rep["lost_microbatches"] == 0 and rep["unfinished_iterations"] == 0


def test_runs_are_deterministic() -> None:
    a = T.run_train("table2-homogeneous", "gwtf", 0.1, 6, 4)
    b = T.run_train("table2-homogeneous", "gwtf", 0.1, 6, 4)
    assert a["per_iteration"] == b["per_iteration"]


@pytest.mark.parametrize("policy", ["gwtf", "swarm"])
def test_waste_breakdown_adds_up_to_the_reported_waste(policy: str) -> None:
    rep = T.run_train("table2-homogeneous", policy, 0.2, 10, 0, breakdown=True)
    assert sum(rep["waste_breakdown_s"].values()) == pytest.approx(rep["wasted_compute_s"], abs=1e-6)
    if policy == "gwtf":  # no restart: mostly what died with crashed relays (and deferrals)
        b = rep["waste_breakdown_s"]
        assert b["data_node"] == 0.0
        assert b["lost_in_crash"] > 0.0
        # a second repair branch, sent when the first one's answer over a slow link came after the data node's
        # deadline: one stage's recompute and backward again in this run (of 10 iterations: seconds per iteration)
        assert b["repeated_on_path"] <= (T.FORWARD_S + T.BACKWARD_S) / 10 + 1e-9, b
        assert b["off_path_live"] + b["off_path_crashed_later"] <= 0.1 * b["lost_in_crash"], b


def test_gwtf_routes_on_the_flow_machines_flows() -> None:
    """`sim train` runs the flow machines of flow.py in its virtual time: no optimum is installed (no reflow), the
    data nodes launch on the units their own machines placed, and every relay's microbatch machine holds its flow
    machine's flows."""
    s = T.make_setting("table2-heterogeneous", 2)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=2))
    sim.run(3)
    rep = sim.report(3)
    assert rep["lost_microbatches"] == 0 and rep["unfinished_iterations"] == 0
    assert sim.machines and sim.reflows == 0 and sim.flow_messages > 0
    for nid, fm in sim.fnodes.items():
        assert {d: o for d, o in sim.nodes[nid].rec.out.items() if o} == {d: o for d, o in fm.out.items() if o}, nid
    placed = {d: sum(sim.fnodes[d].out[d].values()) for d in T.DATA_NODES}
    assert all(placed.values()) and sum(placed.values()) == 3  # this setting's maximum flow (as the LP finds it)
    first = {d: next(e for e in sim.iters[0].opened.items() if e[0] == d)[1] for d in T.DATA_NODES}
    assert 0 < max(first.values()) <= FORMED_WAIT_S  # each data node opened once its flows formed


def test_the_flow_machines_rebuild_the_flows_through_a_crashed_relay() -> None:
    """A relay carrying flow dies: once the membership layer reports it, its neighbours' machines remove it and
    re-form the flows with their own messages (Request Flow ...); no flow goes through it any more, the joiner that
    replaces it is added by its neighbours' machines, and no microbatch is lost."""
    s = T.make_setting("table2-homogeneous", 0)
    probe = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0))
    probe.run(1)
    victim = next(r for r in sorted(probe.fnodes) if r.startswith("s2") and any(probe.fnodes[r].out.values()))
    s = T.make_setting("table2-homogeneous", 0)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0, crash_plan=[(100.0, victim)]))
    sim.run(4)
    rep = sim.report(4)
    assert rep["lost_microbatches"] == 0 and rep["unfinished_iterations"] == 0 and sim.joins == 1
    for nid, fm in sim.fnodes.items():
        if nid in sim.dead:
            continue
        assert victim not in fm.cfg.next_costs and victim not in fm.cfg.prev_costs and victim not in fm.cfg.peers
        assert all(victim not in o for o in fm.out.values()), nid
        assert all(victim not in o for o in sim.nodes[nid].rec.out.values()), nid
    joiner = next(n for n in sim.fnodes if n.startswith(victim + "~"))  # (placed by the leader: maybe elsewhere)
    k = sim.stage[joiner]
    before = [n for n in sim.fnodes if n not in sim.dead and sim.stage[n] == (k - 1 if k > 0 else -1)]
    assert any(joiner in sim.fnodes[n].cfg.next_costs for n in before)
    placed = {d: sum(sim.fnodes[d].out[d].values()) for d in T.DATA_NODES}
    assert placed == {"d0": 4, "d1": 4}


def test_oracle_routing_is_kept_for_comparison() -> None:
    rep = T.run_train("table2-heterogeneous", "gwtf", 0.1, 6, 1, routing="oracle")
    assert rep["lost_microbatches"] == 0 and rep["unfinished_iterations"] == 0
    with pytest.raises(ValueError):
        T.TrainSimOptions(policy="gwtf", churn=0.1, seed=1, routing="best")


@pytest.mark.parametrize("routing", ["machines", "oracle"])
def test_cli_sim_train_json(capsys, routing: str) -> None:
    from gwtf_node import cli
    assert cli.main(["sim", "train", "--setting", "table2-homogeneous", "--churn", "0.1", "--policy", "gwtf",
                     "--iterations", "3", "--seed", "1", "--routing", routing, "--json"]) == 0
    import json
    obj = json.loads(capsys.readouterr().out)
    assert set(cli.SIM_TRAIN_JSON_KEYS) <= set(obj) and obj["lost_microbatches"] == 0


def _data(lend: bool) -> RecoveryNode:
    cfg = RecoveryConfig(node_id="d0", stage=-1, last_stage=1, capacity=3, data_nodes=("d0", "d1"), next_peers={"a": 1.0, "b": 2.0}, prev_peers={"z": 1.0}, peer_capacity={"a": 3, "b": 3},
                         lend=lend)
    return RecoveryNode(cfg, random.Random(0))


def test_a_settled_iteration_is_reported_once_as_an_effect() -> None:
    """The recovery machine tells its driver that a data node's iteration is settled (IterationSettled, once);
    it sends no aggregation message itself and refuses to be handed one."""
    from gwtf_node.protocol.completions import holder_tag
    from gwtf_node.protocol.messages import IterationDone
    from gwtf_node.protocol.recovery import IterationSettled
    cfg = RecoveryConfig(node_id="d0", stage=-1, last_stage=0, capacity=1, data_nodes=("d0",),
                         next_peers={"a": 1.0}, prev_peers={"a": 1.0}, peer_capacity={"a": 1})
    m = RecoveryNode(cfg, random.Random(0))
    m.set_flows({"d0": {"a": 1}})
    m.start(0.0)
    eff = _walk(m, ("d0", 0, 0), "a", 0.0, 2.0)
    settled = IterationSettled(0, 1, 0, (0,), (0,), (holder_tag("a"),))  # seq 0, attempt 0, through a
    assert [e for e in eff if type(e) is IterationSettled] == [settled]
    assert not [e for e in eff if hasattr(e, "msg") and type(e.msg) is IterationDone]
    assert 0 in m.reported
    with pytest.raises(TypeError):
        m.on_message(3.0, "d1", IterationDone(0, 1, 0.0))


@pytest.mark.parametrize("lend", [True, False])
def test_a_relay_borrows_an_idle_unit_of_another_data_node_before_repairing_locally(lend: bool) -> None:
    cfg = RecoveryConfig(node_id="r", stage=0, last_stage=2, capacity=4, data_nodes=("d0", "d1"), next_peers={"a": 1.0, "b": 5.0}, prev_peers={"d0": 1.0, "d1": 1.0},
                         peer_capacity={"a": 2, "b": 2}, prior_s={"a": 5.0, "b": 5.0, "d1": 5.0}, lend=lend)
    m = RecoveryNode(cfg, random.Random(0))
    m.set_flows({"d0": {"b": 1}})  # d0's unit goes to b; d1 has no flow through me
    k = ("d1", 1, 0)
    m.on_message(0.0, "d1", Forward(*k, ("d1",), None, 0))
    eff = m.on_compute_done(1.0, k, "forward")
    assert [e.to for e in _sends(eff, Forward)] == (["b"] if lend else ["a"])  # the idle unit, or the cheapest


@pytest.mark.parametrize("lend", [True, False])
def test_lending_switch_loses_nothing(lend: bool) -> None:
    rep = T.run_train("table2-heterogeneous", "gwtf", 0.2, 8, 3, lend=lend)
    assert rep["lost_microbatches"] == 0 and rep["unfinished_iterations"] == 0


def _sent(eff, t) -> list:
    return [e for e in eff if hasattr(e, "msg") and type(e.msg) is t]


@pytest.mark.parametrize("lend", [True, False])
def test_a_unit_lent_by_the_other_data_node_is_launched_on(lend: bool) -> None:
    """Lend: one unit of d1's flows through b is idle for the iteration; my own unit is busy: I launch on b."""
    from gwtf_node.protocol.messages import Lend
    m = _data(lend)
    m.set_flows({"d0": {"a": 1}})
    assert len([e for e in m.start(0.0) if type(e) is Compute]) == 1
    assert len([e for e in m.on_message(5.0, "d1", Lend(1, "b")) if type(e) is Compute]) == 0  # another iteration
    for _ in range(2):
        eff = m.on_message(5.0, "d1", Lend(0, "b"))
        assert len([e for e in eff if type(e) is Compute]) == (1 if lend else 0)
    fw = [e for e in m.on_compute_done(6.0, ("d0", 1, 0), "forward") if type(e) is not Compute]
    if lend:
        assert [e.to for e in _sends(fw, Forward)] == ["b"]
        assert m.stats.borrowed == 2


def _walk(m: RecoveryNode, k: tuple, relay: str, t: float, rt: float, a: int = 0) -> list:
    """A microbatch launched at `t` through `relay` (a one-stage pipeline) comes back `rt` later; the final's
    effects."""
    m.on_compute_done(t + 0.1, k, "forward")
    m.on_message(t + 0.2, relay, Complete(*k, a))
    m.on_message(t + rt / 2, relay, Forward(*k, ("d0", relay), None, a))
    m.on_compute_done(t + rt / 2 + 0.1, k, "loss")
    m.on_message(t + rt / 2 + 0.2, relay, Complete(*k, a))
    m.on_message(t + rt - 0.1, relay, Backward(*k, None, a))
    return m.on_compute_done(t + rt, k, "final")


@pytest.mark.parametrize("lend", [True, False])
def test_a_data_node_with_nothing_left_to_launch_lends_each_unit_that_frees(lend: bool) -> None:
    from gwtf_node.protocol.messages import Lend
    cfg = RecoveryConfig(node_id="d0", stage=-1, last_stage=0, capacity=1, data_nodes=("d0", "d1", "d2"),
                         next_peers={"a": 1.0}, prev_peers={"a": 1.0}, peer_capacity={"a": 2},
                         lend=lend)
    m = RecoveryNode(cfg, random.Random(0))
    m.set_flows({"d0": {"a": 2}})
    m.start(0.0)
    eff = _walk(m, ("d0", 0, 0), "a", 0.0, 2.1)
    assert m.ledger.counts(0)["completed"] == 1
    lends = _sent(eff, Lend)
    assert sorted((e.to, e.msg) for e in lends) == ([("d1", Lend(0, "a")), ("d2", Lend(0, "a"))] if lend else [])


def test_one_wave_defers_what_the_opening_launch_cannot_place_and_offers_it_first_next_time() -> None:
    from gwtf_node.protocol.pipeline import MbStatus
    cfg = RecoveryConfig(node_id="d0", stage=-1, last_stage=0, capacity=3, data_nodes=("d0",), next_peers={"a": 1.0}, prev_peers={"a": 1.0}, peer_capacity={"a": 3}, one_wave=True)
    m = RecoveryNode(cfg, random.Random(0))
    m.set_flows({"d0": {"a": 1}})
    eff = m.start(0.0)
    assert [e.key for e in eff if type(e) is Compute] == [("d0", 0, 0)]
    assert m.ledger.counts(0)["deferred"] == 2 and m.carry == [1, 2]
    _walk(m, ("d0", 0, 0), "a", 0.0, 2.1)  # the unit frees: nothing more is launched in this iteration
    assert m.ledger.status(0, 0) is MbStatus.COMPLETED and not m.mbs
    m.open_iteration(10.0, 1)
    assert sorted(m.ledger.entries[1]) == [1, 2, 3]  # the two deferred, topped up with one new one


@pytest.mark.parametrize("one_wave", [True, False])
def test_one_wave_relay_denies_upstream_at_once_instead_of_parking(one_wave: bool) -> None:
    from gwtf_node.protocol.messages import MbDeny
    cfg = RecoveryConfig(node_id="r", stage=0, last_stage=1, capacity=2, data_nodes=("d0",), next_peers={"a": 1.0}, prev_peers={"d0": 1.0}, peer_capacity={"a": 1},
                         prior_s={"a": 5.0}, one_wave=one_wave)
    m = RecoveryNode(cfg, random.Random(0))
    m.set_flows({"d0": {"a": 1}})
    k1, k2 = ("d0", 0, 0), ("d0", 1, 0)
    for k in (k1, k2):
        m.on_message(0.0, "d0", Forward(*k, ("d0",), None, 0))
    m.on_compute_done(1.0, k1, "forward")
    eff = m.on_compute_done(1.5, k2, "forward")  # a's one slot is taken by k1
    denies = _sent(eff, MbDeny)
    assert [(e.to, e.msg.seq) for e in denies] == ([("d0", 1)] if one_wave else [])
    assert (k2 in m.mbs) is (not one_wave)


def test_one_wave_loses_nothing_and_defers_for_both_policies() -> None:
    for policy in ("gwtf", "swarm"):
        rep = T.run_train("table2-heterogeneous", policy, 0.2, 8, 1, one_wave=True)
        assert rep["lost_microbatches"] == 0 and rep["unfinished_iterations"] == 0
        assert 0 < rep["throughput_per_iteration"] < 8


def _swarm_data_at_stage_0(**cfg) -> tuple[RecoveryNode, tuple]:
    """A SWARM data node (pipeline d0 -> a -> b -> d0) whose one microbatch a took (MbState fwd)."""
    from gwtf_node.protocol.messages import MbState
    m = RecoveryNode(RecoveryConfig(node_id="d0", stage=-1, last_stage=1, capacity=1, data_nodes=("d0",),
                                    next_peers={"a": 1.0}, prev_peers={"b": 1.0},
                                    peer_capacity={"a": 1}, policy="swarm", **cfg), random.Random(0))
    m.start(0.0)
    k = ("d0", 0, 0)
    m.on_compute_done(0.1, k, "forward")
    m.on_message(0.5, "a", Complete(*k, 0))
    m.on_message(0.6, "a", MbState(*k, 0, 0, "fwd"))
    return m, k


@pytest.mark.parametrize("backward_done_at_b", [True, False])
def test_a_data_node_acts_on_a_gone_holder_only_before_its_stage_backward(backward_done_at_b: bool) -> None:
    """SWARM, `act_on_gone`: the membership layer reports a holder of a microbatch in its backward pass dead.
    Relays report their backward (MbState grad); a holder whose stage the backward already passed needs nothing
    (its gradient went upstream), so no restart; one whose backward is still to come: restart at once."""
    from gwtf_node.protocol.messages import MbState, Release
    m, k = _swarm_data_at_stage_0()
    m.on_message(0.7, "b", MbState(*k, 0, 1, "fwd"))
    m.on_message(1.0, "b", Forward(*k, ("d0", "a", "b"), None, 0))
    m.on_compute_done(1.1, k, "loss")
    m.on_message(1.5, "b", Complete(*k, 0))
    if backward_done_at_b:
        m.on_message(1.8, "b", MbState(*k, 0, 1, "grad"))
    eff = m.peer_gone(2.0, "b")
    released = _sent(eff, Release)
    assert (m.stats.restarts, len(released)) == ((0, 0) if backward_done_at_b else (1, 2)), eff
    if backward_done_at_b:
        eff = m.peer_gone(2.5, "a")  # stage 0's backward is still to come: restart
        assert m.stats.restarts == 1 and {e.to for e in _sent(eff, Release)} == {"a", "b"}


@pytest.mark.parametrize("act_on_gone", [True, False])
def test_a_gone_report_during_the_forward_pass_is_acted_on_at_the_sink(act_on_gone: bool) -> None:
    """SWARM, `act_on_gone`: a holder is reported gone while the microbatch's forward is still on its way to the
    sink (so `peer_gone` does not act: the microbatch is not in its backward pass yet).  When the loss is computed
    the data node knows the backward cannot pass the gone holder: it restarts then, instead of sending the gradient
    and waiting for its watchdog (minutes).  Without `act_on_gone`: the gradient goes down as before."""
    from gwtf_node.protocol.messages import Backward, MbState, Release
    m, k = _swarm_data_at_stage_0(act_on_gone=act_on_gone)
    eff = m.peer_gone(0.8, "a")  # a handed its output on to b and died: no action yet (forward pass)
    assert m.stats.restarts == 0 and not _sent(eff, Release)
    m.on_message(0.7, "b", MbState(*k, 0, 1, "fwd"))
    m.on_message(1.0, "b", Forward(*k, ("d0", "a", "b"), None, 0))
    eff = m.on_compute_done(1.1, k, "loss")
    if act_on_gone:
        assert m.stats.restarts == 1 and {e.to for e in _sent(eff, Release)} == {"a", "b"}
        assert not _sent(eff, Backward) and m.mbs[k].attempt == 1
    else:
        assert m.stats.restarts == 0 and [e.to for e in _sent(eff, Backward)] == ["b"]


def test_daemon_detect_s_is_the_daemons_liveness_check() -> None:
    """DAEMON_DETECT_S models the daemon's liveness check: a peer silent for DEAD_AFTER_S is dead, the check runs
    every PING_EVERY_S, so a crash is known DEAD_AFTER_S to DEAD_AFTER_S + PING_EVERY_S after it."""
    from gwtf_node.runtime.node import liveness
    assert T.DAEMON_DETECT_S == liveness.DEAD_AFTER_S + liveness.PING_EVERY_S



@pytest.mark.parametrize("fastest", [True, False])
def test_a_data_node_launches_first_on_the_unit_that_brought_microbatches_back_first(fastest: bool) -> None:
    """recovery.py, "Fastest unit first": a's link is the cheaper, but microbatches through b came back in
    10 s and through a in 50 s; the next iteration's first launch goes to b (without the switch: to a)."""
    cfg = RecoveryConfig(node_id="d0", stage=-1, last_stage=0, capacity=2, data_nodes=("d0",), next_peers={"a": 1.0, "b": 2.0}, prev_peers={"a": 1.0, "b": 1.0},
                         peer_capacity={"a": 1, "b": 1}, fastest_unit=fastest)
    m = RecoveryNode(cfg, random.Random(0))
    m.set_flows({"d0": {"a": 1, "b": 1}})
    m.start(0.0)
    hops = {k: dm.next for k, dm in m.mbs.items()}
    assert sorted(hops.values()) == ["a", "b"]
    for k, h in sorted(hops.items()):
        _walk(m, k, h, 0.0, 50.0 if h == "a" else 10.0)
    assert m.ledger.counts(0)["completed"] == 2
    assert m.rt == ({"a": 50.0, "b": 10.0})
    m.open_iteration(60.0, 1)
    first = min(m.mbs)  # the first launch took the best free unit; the second the other one
    assert m.mbs[first].next == ("b" if fastest else "a")
    _walk(m, first, m.mbs[first].next, 60.0, 20.0)
    assert m.ledger.counts(1)["completed"] == 1
    h = m.rt["b" if fastest else "a"]
    assert h == pytest.approx(0.7 * (10.0 if fastest else 50.0) + 0.3 * 20.0)  # an EWMA
    # a microbatch that needed a new attempt (a restart, a park) is not a sample
    other = min(m.mbs)
    m.mbs[other].attempt = 1
    before = dict(m.rt)
    _walk(m, other, m.mbs[other].next, 60.0, 300.0, a=1)
    assert m.ledger.counts(1)["completed"] == 2 and m.rt == before


def test_compute_times_follow_the_stage_profile() -> None:
    """The simulator's compute times are scripts/profile_stages.py's measured ratios times one anchor."""
    import json
    doc = json.loads(T.PROFILE_FILE.read_text())
    assert doc["format"] == "gwtf-stage-profile/1"
    r = doc["ratio_to_relay_forward"]
    assert r["relay_forward"] == 1.0
    assert T.BACKWARD_S == pytest.approx(T.FORWARD_S * r["relay_backward"])
    assert T.DATA_LOSS_S == pytest.approx(T.FORWARD_S * r["data_loss"])
    assert T.compute_s(-1, "loss") == T.DATA_LOSS_S and T.compute_s(2, "recompute") == T.FORWARD_S
    for k, v in doc["seconds"].items():  # the ratios are those of the measured seconds
        assert r[k] == pytest.approx(v / doc["seconds"]["relay_forward"], abs=1e-3)


def test_the_published_geo_links_are_read_the_same_by_the_daemon_and_the_simulator(tmp_path):
    """The NL-London entry of data/geo12-links.json (about 2 Mbit/s, a typo for 2 Gbit/s) is read in Gbit/s by both."""
    import json
    import random
    from pathlib import Path

    from gwtf_node.runtime.net.linkspec import resolve_links
    from gwtf_node.sim.train.setting import make_net

    raw = json.loads((Path(__file__).resolve().parents[2] / "gwtf_node/data/geo12-links.json").read_text())
    slow = min(raw["links"], key=lambda e: e["bandwidth_mbps"])
    assert slow["bandwidth_mbps"] < 10
    net = make_net(["x"], random.Random(0))
    sim_bw = net.bw[(slow["a"], slow["b"])]
    names = [f"n{i}" for i in range(len(raw["locations"]))]  # placed on the locations round-robin
    path = tmp_path / "geo.json"
    path.write_text(json.dumps(raw))
    where = {n: raw["locations"][i] for i, n in enumerate(names)}
    a = next(n for n in names if where[n] == slow["a"])
    b = next(n for n in names if where[n] == slow["b"])
    resolved = {(ln["a"], ln["b"]): ln["bandwidth_mbps"] for ln in resolve_links(path, names)["links"]}
    daemon_bw = resolved[(a, b)]
    assert sim_bw == daemon_bw == slow["bandwidth_mbps"] * 1000.0


def _relay_with_two_gradients() -> RecoveryNode:
    """A stage-0 relay of a one-stage pipeline that computed the backward of ("d0", 0, 0) and ("d0", 1, 0)."""
    cfg = RecoveryConfig(node_id="a", stage=0, last_stage=0, capacity=2, data_nodes=("d0",),
                         next_peers={"d0": 1.0}, prev_peers={"d0": 1.0}, peer_capacity={"d0": 2})
    m = RecoveryNode(cfg, random.Random(0))
    m.set_flows({"d0": {"d0": 2}})
    m.start(0.0)
    for seq in (0, 1):
        k = ("d0", seq, 0)
        m.on_message(1.0, "d0", Forward(*k, ("d0",), None, 0))
        m.on_compute_done(1.1, k, "forward")
        m.on_message(1.5, "d0", Backward(*k, None, 0))
        m.on_compute_done(1.6, k, "backward")
    return m


def test_a_relay_counts_only_gradients_of_microbatches_its_data_node_completed() -> None:
    """BEGIN names each data node's completed seqs: a gradient held for an attempt the data node gave up (its
    Release lost) does not count; the microbatch counts in the iteration where it completes."""
    _, everything = _relay_with_two_gradients().begin_aggregation(2.0, 0)
    assert everything == frozenset({("d0", 0, 0), ("d0", 1, 0)})
    m = _relay_with_two_gradients()
    _, counted = m.begin_aggregation(2.0, 0, {"d0": {0}})
    assert counted == frozenset({("d0", 0, 0)})
    assert m.stats.uncounted == 1
    _, none = _relay_with_two_gradients().begin_aggregation(2.0, 0, {"d1": {0, 1}})
    assert none == frozenset()  # a data node BEGIN does not name (it died before BEGIN): none of its gradients


def test_a_relay_counts_only_the_attempt_that_completed_the_microbatch() -> None:
    from gwtf_node.protocol.completions import Completion

    """BEGIN names the attempt that completed each seq: a gradient this relay holds of an older attempt (its data
    node restarted the microbatch through other holders and the Release to this one was lost) does not count,
    or the stage would count the microbatch twice."""
    m = _relay_with_two_gradients()  # both gradients of attempt 0
    _, counted = m.begin_aggregation(2.0, 0, {"d0": {0: Completion(1), 1: Completion(0)}})
    assert counted == frozenset({("d0", 1, 0)}) and m.stats.uncounted == 1
    _, counted = _relay_with_two_gradients().begin_aggregation(2.0, 0, {"d0": {0: Completion(), 1: Completion()}})
    assert counted == frozenset({("d0", 0, 0), ("d0", 1, 0)})  # attempts not named: any attempt counts
    # the same microbatch taken again in attempt 1 and its backward computed: attempt 1's gradient counts
    m = _relay_with_two_gradients()
    k = ("d0", 0, 0)
    m.on_message(3.0, "d0", Forward(*k, ("d0",), None, 1))
    m.on_compute_done(3.1, k, "forward")
    m.on_message(3.5, "d0", Backward(*k, None, 1))
    m.on_compute_done(3.6, k, "backward")
    _, counted = m.begin_aggregation(4.0, 0, {"d0": {0: Completion(1), 1: Completion(0)}})
    assert counted == frozenset({("d0", 0, 0), ("d0", 1, 0)})


def test_a_joiner_answered_by_a_gone_source_and_by_its_replacement_comes_in_once() -> None:
    """Heterogeneous, 20% churn, seed 2: a joiner's source is reported gone after its state left, the replacement
    answers too; the joiner loads the first and comes in once (it came in twice, and the run failed)."""
    rep = T.run_train("table2-heterogeneous", "gwtf", 0.2, 16, 2)
    j = rep["joining"]
    assert j["in"] <= j["loaded"] <= j["placed"] <= j["asked"] and rep["unfinished_iterations"] == 0, j


def test_the_random_policy_draws_next_hops_where_swarm_takes_the_nearest() -> None:
    """`--policy random` (the blind-routing baseline of scripts/bench_internet.py): SWARM's machinery, the next hop
    drawn with the machine's seeded generator among the live peers with room; SWARM takes the cheapest."""
    picks = {}
    for policy in ("swarm", "random"):
        m = RecoveryNode(RecoveryConfig(node_id="d0", stage=-1, last_stage=1, capacity=4, data_nodes=("d0",),
                                        next_peers={"a": 1.0, "b": 5.0, "c": 9.0}, prev_peers={"z": 1.0},
                                        policy=policy), random.Random(3))
        picks[policy] = [m.routing.greedy(m, set()) for _ in range(40)]
        assert m.routing.greedy(m, {"a", "b", "c"}) is None
    assert set(picks["swarm"]) == {"a"}
    assert set(picks["random"]) == {"a", "b", "c"}
    rep = T.run_train("table2-homogeneous", "random", 0.0, 3, 0)
    assert rep["lost_microbatches"] == 0 and rep["throughput_per_iteration"] == 8
