"""Scaled formation (protocol/flow/scaling.py): cost scaling by one machine a node forms the min-cost maximum
flow (networkx), hands it to the flow machines, and refuses what it cannot form."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.flow.scaling import ScaledNode, ScalingMachine, own_arcs
from gwtf_node.protocol.messages import CostAnnounce, Label, Side
from gwtf_node.protocol.neighbourhood import bound_links
from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.protocol.scalemsgs import ScaleAbort, ScaleCredit, ScaleDone, ScalePhase, ScalePush
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import flow_configs, run_gwtf
from gwtf_node.sim.scenarios import FlowSetting, generate_layered, load_flow_setting


def _layered(relays: int, stages: int, seed: int, k: int = 0):
    sc = parse_scenario(generate_layered(f"t-{relays}x{stages}", FlowSetting(1, relays, stages, (1, 3), (1, 20)), seed))
    return bound_links(sc, k)


def _exact(sc, got) -> None:
    opt = optimal_routing(sc)
    assert got.num_flows == opt.num_flows > 0
    assert got.mean_cost == pytest.approx(opt.mean_cost)
    assert got.extra["inconsistent_links"] == 0  # both ends of every link hold the same units


@pytest.mark.parametrize("relays, stages, seed, k", [(24, 4, 0, 0), (40, 5, 1, 3), (64, 8, 2, 4), (96, 8, 3, 4)])
def test_scaled_formation_forms_the_min_cost_maximum_flow(relays, stages, seed, k):
    sc = _layered(relays, stages, seed, k)
    got = run_gwtf(sc, seed=seed, formation="scaling")
    _exact(sc, got)
    assert got.extra["formation"] == "scaling" and got.extra["formed_s"] > 0
    assert got.extra["scaling_phases"] >= 2 and got.extra["held_dropped"] == 0
    by_type = got.extra["messages_by_type"]
    assert by_type["ScaleDone"] == len(sc.nodes) - 1  # the data node ends formation at every other node
    assert by_type["ScalePhase"] == got.extra["scaling_phases"] * (len(sc.nodes) - 1)


@pytest.mark.parametrize("setting", [1, 3])
def test_scaled_formation_on_table_v_settings(setting):
    sc = load_flow_setting(setting, 0)
    _exact(sc, run_gwtf(sc, formation="scaling"))


def test_the_flow_machines_keep_the_formed_flows():
    """After the handover the flow machines run their rounds on the adopted units: nothing moves (they are
    optimal), and the data node's first wave finds no route to add."""
    sc = _layered(64, 8, 2, 4)
    got = run_gwtf(sc, formation="scaling", quiet_rounds=40)
    _exact(sc, got)
    assert got.extra["moves"] == 0
    assert got.converged_round == int(-(-got.extra["formed_s"] // 1))  # the last change is the handover
    assert got.rounds >= got.converged_round + 40


def test_waves_and_scaling_agree_and_waves_stay_the_default():
    sc = _layered(40, 5, 1, 3)
    waves, scaled = run_gwtf(sc), run_gwtf(sc, formation="scaling")
    assert "formation" not in waves.extra and "ScalePush" not in waves.extra["messages_by_type"]
    assert (waves.num_flows, waves.mean_cost) == (scaled.num_flows, pytest.approx(scaled.mean_cost))
    with pytest.raises(ValueError, match="formation"):
        run_gwtf(sc, formation="push")


def test_own_arcs_refuse_what_cost_scaling_cannot_form():
    sc = _layered(24, 4, 0)
    cfgs = flow_configs(sc)
    relay = next(c for c in cfgs.values() if not c.is_data)
    peer = next(iter(relay.next_costs))
    with pytest.raises(ValueError, match="integer link costs"):
        own_arcs(replace(relay, next_costs={**relay.next_costs, peer: 2.5}), 100)
    with pytest.raises(ValueError, match="one data node"):
        own_arcs(replace(relay, commodities=("a", "b")), 100)
    arcs = own_arcs(relay, 100)
    assert arcs[(("in", relay.node_id), ("out", relay.node_id))] == [relay.capacity, 0]
    inn, out = ("in", relay.node_id), ("out", relay.node_id)
    assert all(c == 0 for (u, v), (c, _) in arcs.items() if u == inn and v != out)  # residual reverses: empty
    assert {v[1] for (u, v) in arcs if u == out and v != inn} == set(relay.next_costs)
    small = {p: 1 for p in relay.next_costs}
    assert all(c == 1 for (u, v), (c, _) in own_arcs(relay, 100, small).items() if u == out and v != inn)


def test_flow_messages_before_the_handover_are_held_then_handled():
    cfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    host = ScaledNode(FlowNode(cfg, random.Random(0)), ScalingMachine("r", own_arcs(cfg, 50), "d"))
    assert len(host.start(0.0)) == 1 and host.on_timer(0.5, "tick") == []  # (its give-up timer)
    label = CostAnnounce((Label("d", Side.IN, 7.0, ("d",), 1),))
    assert host.on_message(1.0, "d", label) == []
    assert host.held == [("d", label)] and host.handed is None
    eff = host.on_message(2.0, "d", ScaleDone(1))
    assert host.handed == 2.0 and host.held == []
    assert eff  # the flow machine started: its labels and its first tick
    assert host.on_message(3.0, "d", ScaleDone(1)) == []  # formation messages after the handover change nothing


def _churn_run(formation: str, seed: int = 2):
    from gwtf_node.sim.flowchurn import FlowRun
    sc = _layered(64, 8, seed)
    return FlowRun(sc, seed, neighbours=4, formation=formation)


def test_a_relay_that_crashes_during_formation_calls_it_off_and_waves_form_the_flows():
    from gwtf_node.sim.flowchurn import Churn
    run = _churn_run("scaling")
    run.sim.run_until(3.0)
    assert run.formed() is None  # formation is under way
    victim = next(nid for nid, h in sorted(run.hosts.items()) if not run.nodes[nid].cfg.is_data
                  and h.scaling.phase > 0)
    changed = run.apply(Churn(kill=(victim,), detect_s=1.0))
    run.run_quiet(200)
    assert run.formed() is not None and all(h.aborted for nid, h in run.hosts.items() if nid in run.nodes)
    by_type = run.sim.stats.messages_by_type
    assert by_type["ScaleAbort"] >= len(run.nodes) - 1 and "ScaleDone" not in by_type
    got = run.routing()
    opt = optimal_routing(changed)
    assert got.num_flows == opt.num_flows and got.extra["inconsistent_links"] == 0  # label waves formed them


def test_a_relay_that_crashes_after_formation_is_repaired_by_the_flow_machines():
    from gwtf_node.sim.flowchurn import Churn
    run = _churn_run("scaling")
    run.run_quiet(120)
    formed = run.formed()
    assert formed is not None and not any(h.aborted for h in run.hosts.values())
    victim = next(nid for nid in sorted(run.nodes) if run.nodes[nid].units.out and not run.nodes[nid].cfg.is_data
                  and any(run.nodes[nid].units.out.values()))
    changed = run.apply(Churn(kill=(victim,), detect_s=1.0))
    run.run_quiet(120)
    got = run.routing()
    assert got.num_flows == optimal_routing(changed).num_flows and got.extra["inconsistent_links"] == 0
    assert "ScaleAbort" not in run.sim.stats.messages_by_type


def test_a_node_that_hears_nothing_of_formation_gives_up_and_starts_its_flow_machine():
    from gwtf_node.protocol.flow.scaling import GIVE_UP, GIVE_UP_S
    cfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    host = ScaledNode(FlowNode(cfg, random.Random(0)), ScalingMachine("r", own_arcs(cfg, 50), "d"))
    assert host.start(0.0) == [SetTimer(GIVE_UP, GIVE_UP_S)]
    host.on_message(100.0, "d", ScalePhase(1, 4, "1/2", 5))  # heard at 100 s: the deadline moves
    assert host.on_timer(GIVE_UP_S, GIVE_UP) == [SetTimer(GIVE_UP, 100.0 + GIVE_UP_S)]
    eff = host.on_timer(100.0 + GIVE_UP_S, GIVE_UP)
    assert host.aborted and host.handed == 100.0 + GIVE_UP_S
    assert not any(isinstance(e, Send) and isinstance(e.msg, ScaleAbort) for e in eff)  # it saw no one leave


def test_formation_messages_that_fit_no_arc_of_the_node_are_dropped_and_counted():
    cfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    machine = ScalingMachine("r", own_arcs(cfg, 50), "d")
    host = ScaledNode(FlowNode(cfg, random.Random(0)), machine)
    host.start(0.0)
    assert host.on_message(1.0, "d", ScalePhase(1, 40, "1/2", 5))  # the data node's phase: the relay saturates
    before = dict(machine.cap)
    bad = [("x", ScalePush("out", "in", 1, 0, 1, 40, "0")),  # from a node it has no link to
           ("d", ScalePush("out", "in", 1, 0, 1, 40, "0")),  # the data node has no OUT side
           ("d", ScalePush("source", "in", 0, 0, 1, 40, "0")),  # no units
           ("x", ScalePhase(2, 20, "1/2", 5)),  # phases come from the data node only
           ("d", ScaleCredit("1/2")),  # credit goes to the data node only
           ("x", ScaleAbort("x says so"))]  # and so does calling formation off
    for sender, msg in bad:
        assert host.on_message(2.0, sender, msg) == []
    assert machine.ignored == len(bad) and machine.cap == before and host.handed is None
    host.on_message(3.0, "d", ScalePush("source", "in", 1, -10**6, 1, 40, "1/2"))  # a push it takes
    assert machine.ignored == len(bad) and machine.cap != before
