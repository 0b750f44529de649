"""Scaled formation (protocol/flow/scaling.py): cost scaling by one machine a node forms the min-cost maximum
flow (networkx), hands it to the flow machines, and refuses what it cannot form."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.flow.scaled import ScaledNode
from gwtf_node.protocol.flow.scaling import EAGER_PHASES, ScalingMachine, own_arcs
from gwtf_node.protocol.messages import CostAnnounce, Label, Side
from gwtf_node.protocol.neighbourhood import bound_links
from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.protocol.scalemsgs import (
    ScaleAbort, ScaleCredit, ScaleDone, ScaleNack, ScalePhase, ScaleProbe, ScalePush, ScaleRefuse,
)
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


def test_every_phase_tells_its_relabels_and_forms_as_exactly():
    """`EAGER_PHASES`: the relabels of every phase go to the neighbours (`ScalePrice`); with the first phase's alone
    told (`eager_phases=1`), or none (`eager_phases=0`), formation ends on the same flows, later."""
    sc = _layered(64, 8, 2, 4)
    told, first, lazy = (run_gwtf(sc, seed=2, formation="scaling", eager_phases=n) for n in (EAGER_PHASES, 1, 0))
    for got in (told, first, lazy):
        _exact(sc, got)
    prices = [got.extra["messages_by_type"].get("ScalePrice", 0) for got in (told, first, lazy)]
    assert prices[0] > prices[1] > prices[2] == 0
    assert told.extra["formed_s"] < first.extra["formed_s"] < lazy.extra["formed_s"]


def test_a_relabel_is_told_only_to_the_nodes_that_can_push_to_the_side():
    """`tells`: a side's price goes where the reverse arc has room (a link into the side not full, a link out of
    it carrying flow); the others push to the side only after it pushes to them, with its price."""
    cfg = FlowConfig("r", False, 2, ("d",), {"c": 3.0}, {"a": 4.0, "b": 5.0}, ())
    own = own_arcs(cfg, 0, {"a": 1, "b": 2, "c": 2})
    inn, out = ("in", "r"), ("out", "r")
    assert own[(inn, ("out", "a"))] == [0, -4, 1] and own[(out, ("in", "c"))] == [2, 3]
    m = ScalingMachine("r", own, "d")
    assert m.tells(inn, ("out", "a")) and m.tells(inn, ("out", "b"))  # no flow yet: both links have room
    assert not m.tells(out, ("in", "c"))  # nothing sent to c: c has no arc back to r
    m.cap[(inn, ("out", "a"))] = 1  # a sends r its link's whole capacity, b one of two
    m.cap[(inn, ("out", "b"))] = 1
    m.cap[(out, ("in", "c"))] = 1  # r sends c one unit
    assert not m.tells(inn, ("out", "a")) and m.tells(inn, ("out", "b")) and m.tells(out, ("in", "c"))


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
    assert all(arc[0] == 0 for (u, v), arc in arcs.items() if u == inn and v != out)  # residual reverses: empty
    assert {v[1] for (u, v) in arcs if u == out and v != inn} == set(relay.next_costs)
    small = {p: 1 for p in relay.next_costs}
    assert all(arc[0] == 1 for (u, v), arc in own_arcs(relay, 100, small).items() if u == out and v != inn)


def test_flow_messages_before_the_handover_are_held_then_handled():
    cfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    host = ScaledNode(FlowNode(cfg, random.Random(0)), ScalingMachine("r", own_arcs(cfg, 50), "d"))
    assert len(host.start(0.0)) == 1 and host.on_timer(0.5, "tick") == []  # (its give-up timer)
    host.on_message(0.8, "d", ScalePhase(1, 100, "1/2", 4, seq=1))  # (before a first phase it would hand over)
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
    from gwtf_node.protocol.flow.scaled import GIVE_UP, GIVE_UP_S
    cfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    host = ScaledNode(FlowNode(cfg, random.Random(0)), ScalingMachine("r", own_arcs(cfg, 50), "d"))
    assert host.start(0.0) == [SetTimer(GIVE_UP, GIVE_UP_S)]
    host.on_message(100.0, "d", ScalePhase(1, 4, "1/2", 5, seq=1))  # heard at 100 s: the deadline moves
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
    declined = [("x", ScalePush("out", "in", 1, 0, 1, 40, "0")),  # from a node it has no link to
                ("d", ScalePush("out", "in", 1, 0, 1, 40, "0"))]  # the data node has no OUT side
    for sender, msg in declined:  # the units go back, the sender drops the arc (the credit, none here, goes on)
        (refusal,) = host.on_message(2.0, sender, msg)
        assert refusal.to == sender and replace(refusal.msg, seq=0) == ScaleRefuse("out", "in", 1, 0, 1, 40, "0", True)
    bad = [("d", ScalePush("source", "in", 0, 0, 1, 40, "0")),  # no units
           ("x", ScalePhase(2, 20, "1/2", 5)),  # phases come from the data node only
           ("d", ScaleCredit("1/2")),  # credit goes to the data node only
           ("x", ScaleAbort("x says so"))]  # and so does calling formation off
    for sender, msg in bad:
        assert host.on_message(2.0, sender, msg) == []
    assert machine.ignored == len(bad) and machine.cap == before and host.handed is None
    host.on_message(3.0, "d", ScalePush("source", "in", 1, -10**6, 1, 40, "1/2"))  # a push it takes
    assert machine.ignored == len(bad) and machine.cap != before


def test_sim_flow_scaled_prints_the_flows_and_refuses_what_it_cannot_form_or_a_contradiction(tmp_path, capsys):
    import json

    from gwtf_node.cli import main
    from gwtf_node.sim.scenarios import flow_setting_scenario

    one, two, frac = tmp_path / "s1.json", tmp_path / "s5.json", tmp_path / "s1f.json"
    one.write_text(json.dumps(flow_setting_scenario(1, 0)))
    two.write_text(json.dumps(flow_setting_scenario(5, 0)))
    doc = flow_setting_scenario(1, 0)
    doc["links"][0]["cost"] = 2.5
    frac.write_text(json.dumps(doc))
    assert main(["sim", "flow", "--scenario", str(one), "--scaled", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.splitlines()[-1])
    opt = optimal_routing(load_flow_setting(1, 0))
    assert len(res["flows"]) == opt.num_flows and res["formation"] == "scaling"
    assert main(["sim", "flow", "--scenario", str(two), "--scaled"]) == 2
    assert "one data node (this scenario has 2)" in capsys.readouterr().err
    assert main(["sim", "flow", "--scenario", str(one), "--scaled", "--policy", "swarm"]) == 2
    assert main(["sim", "flow", "--scenario", str(one), "--scaled", "--waves"]) == 2
    assert "--scaled and --waves contradict each other" in capsys.readouterr().err
    # a fractional link cost is taken in whole COST_QUANTUM_MS, as the daemon takes its measured costs
    assert main(["sim", "flow", "--scenario", str(frac), "--scaled", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert res["formation"] == "scaling" and len(res["flows"]) == opt.num_flows


def test_only_a_neighbour_at_the_other_end_of_an_arc_that_stays_away_calls_formation_off():
    """A neighbour presumed dead calls formation off when it is not back within LEFT_GRACE_S (a false death on a
    busy host is); a same-stage peer, at the end of no arc, never does."""
    from gwtf_node.protocol.flow.scaled import GIVE_UP, LEFT_GRACE_S

    cfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ("p",))
    host = ScaledNode(FlowNode(cfg, random.Random(0)), ScalingMachine("r", own_arcs(cfg, 50), "d"))
    host.start(0.0)
    host.on_message(0.5, "d", ScalePhase(1, 100, "1/2", 4, seq=1))  # (before it, no grace runs: the next test)
    assert host.remove_neighbour(1.0, "p") == []  # a same-stage peer: no arc of formation leads to it
    assert host.handed is None and not host.aborted
    assert host.remove_neighbour(2.0, "d") == [SetTimer(GIVE_UP, 2.0 + LEFT_GRACE_S)]
    host.add_neighbour(10.0, "d", 3.0, "next")  # back (its Hello): formation goes on
    assert host.on_timer(2.0 + LEFT_GRACE_S, GIVE_UP) != [] and not host.aborted
    host.remove_neighbour(40.0, "d")
    assert host.on_timer(40.0 + LEFT_GRACE_S - 1.0, GIVE_UP) and not host.aborted
    eff = host.on_timer(40.0 + LEFT_GRACE_S, GIVE_UP)
    assert host.aborted and host.handed == 40.0 + LEFT_GRACE_S
    assert Send("d", ScaleAbort("d left during formation", seq=2, ack=1)) in eff  # (its credit was seq 1)
    left = ScaledNode(FlowNode(cfg, random.Random(0)), ScalingMachine("r", own_arcs(cfg, 50), "d"))
    left.start(0.0)
    eff = left.formation.neighbour_left(2.0, "d", presumed=False)  # it left (Goodbye), or restarted: no grace
    assert left.formation.over is not None and Send("d", ScaleAbort("d left during formation", seq=1)) in eff


def test_a_relays_grace_for_a_neighbour_presumed_dead_starts_at_its_first_phase():
    """Before a first phase nothing of formation has passed: a neighbour presumed dead then (a data node busy at
    the opening) has its grace from the first phase on."""
    from gwtf_node.protocol.flow.scaled import GIVE_UP, LEFT_GRACE_S

    cfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    host = ScaledNode(FlowNode(cfg, random.Random(0)), ScalingMachine("r", own_arcs(cfg, 50), "d"))
    host.start(0.0)
    host.remove_neighbour(1.0, "d")
    host.on_timer(1.0 + 5 * LEFT_GRACE_S, GIVE_UP)
    assert not host.aborted  # no phase yet: no grace running
    eff = host.on_message(300.0, "d", ScalePhase(1, 100, "1/2", 4, seq=1))
    assert SetTimer(GIVE_UP, 300.0 + LEFT_GRACE_S) in eff
    host.on_timer(300.0 + LEFT_GRACE_S, GIVE_UP)
    assert host.aborted and "d left during formation" in host.formation.why


def test_a_push_over_a_link_the_head_does_not_have_is_declined_and_formation_ends_exact():
    """The daemon's nodes measure their links at their own times, so a relay may link to a next-stage relay that
    does not link back: that relay declines the pushes (`ScaleRefuse(gone=True)`), the tail drops the arc, the
    credit goes on, and the flows are the optimum without the link."""
    from gwtf_node.protocol.scenario import Scenario
    from gwtf_node.sim.flowsim import extract_flows

    sc = _layered(40, 4, 1)
    cfgs = flow_configs(sc)
    opt_before = optimal_routing(sc)
    used = {(a, b) for f in opt_before.flows for a, b in zip(f.path, f.path[1:])}
    tail, head = sorted(used)[0]  # a link the optimum uses: its pushes come early
    cfgs[head] = replace(cfgs[head], prev_costs={p: c for p, c in cfgs[head].prev_costs.items() if p != tail})
    hosts, sim, _ = _scaled_run(sc, cfgs)
    nodes = {nid: h.flow for nid, h in hosts.items()}
    assert all(h.handed is not None and not h.aborted for h in hosts.values())
    assert hosts[tail].scaling.given[(("out", tail), ("in", head))] == 0  # the arc went
    assert sim.stats.messages_by_type.get("ScaleRefuse", 0) > 0
    cut = Scenario(sc.name, sc.stages, sc.nodes, tuple(l for l in sc.links if {l.a, l.b} != {tail, head}),
                   sc.activation_mb)
    flows, mismatched = extract_flows(cut, nodes)
    opt = optimal_routing(cut)
    assert mismatched == 0 and len(flows) == opt.num_flows
    assert sum(f.cost for f in flows) == pytest.approx(opt.mean_cost * opt.num_flows)


def _scaled_run(sc, cfgs, until_s: float = 3600.0):
    from gwtf_node.sim.engine import Simulator
    from gwtf_node.sim.flowsim import extract_flows, link_delays, scaled_nodes

    nodes = {nid: FlowNode(cfg, random.Random(nid)) for nid, cfg in cfgs.items()}
    hosts = scaled_nodes(sc, cfgs, nodes)
    sim = Simulator(link_delays(sc))
    for nid in sorted(hosts):
        sim.add(nid, hosts[nid])
    sim.start_all()
    sim.run_until(until_s, stop=lambda now: all(h.handed is not None for h in hosts.values()))
    return hosts, sim, extract_flows(sc, nodes)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_downstream_end_takes_the_upstream_ends_link_cost(seed):
    """The daemon's two ends of a link may measure it apart (the downstream end's own round trip, before the
    upstream end's LinkCost): with each end pricing the link its own way a refused push would go back and forth
    for ever.  Pushes and refusals from the upstream end carry its cost, and the flows are the optimum at it."""
    sc = _layered(40, 5, seed, 3)
    cfgs = flow_configs(sc)
    for nid, cfg in list(cfgs.items()):
        if not cfg.is_data:  # every relay measured its upstream links 7 dearer, or 5 cheaper
            cfgs[nid] = replace(cfg, prev_costs={p: max(0, c + (7 if sum(map(ord, p)) % 2 else -5))
                                                 for p, c in cfg.prev_costs.items()})
    hosts, sim, (flows, mismatched) = _scaled_run(sc, cfgs)
    assert all(h.handed is not None and not h.aborted for h in hosts.values())
    opt = optimal_routing(sc)
    assert mismatched == 0 and len(flows) == opt.num_flows
    assert sum(f.cost for f in flows) == pytest.approx(opt.mean_cost * opt.num_flows)


def test_the_data_node_calls_formation_off_when_it_hears_nothing_for_a_while():
    """Credit lost (a message, or a node the data node cannot see) would stall formation for ever: the data node
    that hears nothing for STALL_S calls it off, and every node forms its flows with label waves."""
    from gwtf_node.protocol.flow.scaled import GIVE_UP, STALL_S
    from gwtf_node.protocol.flow.scaling import machine_for

    cfg = FlowConfig("d", True, 2, ("d",), {"r": 3.0}, {"r": 4.0}, ())
    host = ScaledNode(FlowNode(cfg, random.Random(0)), machine_for(cfg, {"r": 2}, ("r",), 1))
    eff = host.start(0.0)
    assert Send("r", ScalePhase(1, host.scaling.eps, "1/2", host.scaling.alpha, seq=1)) in eff
    # the numbered messages to r: the phase, and pushes over the source's arc (a ScalePrice is not numbered)
    sent = sum(isinstance(e, Send) and e.to == "r" and bool(getattr(e.msg, "seq", 0)) for e in eff)
    probes, t = 0, next(e.deadline for e in eff if isinstance(e, SetTimer))
    while not host.aborted:  # the relay never answers, not even the probes
        eff = host.on_timer(t, GIVE_UP)
        probes += sum(isinstance(e, Send) and e.to == "r" and e.msg == ScaleProbe(1, sent) for e in eff)
        t = next((e.deadline for e in eff if isinstance(e, SetTimer)), t)
    assert host.handed == STALL_S and probes == 16  # at 10, 30 s, then every 40 s up to 590 s
    assert SetTimer(GIVE_UP, STALL_S + 10.0) in eff  # then it probes for the relay's acknowledgement of the end
    (abort,) = [e for e in eff if isinstance(e, Send) and isinstance(e.msg, ScaleAbort)]
    assert abort.to == "r" and "phase 1" in abort.msg.reason


@pytest.mark.parametrize("relays, stages, seed, loss", [(40, 5, 1, 0.005), (64, 8, 2, 0.01)])
def test_formation_over_links_that_lose_messages_sends_them_again_and_ends_exact(relays, stages, seed, loss):
    """Each lost message of formation (a lost push loses units and credit: the phase would never end) is sent again
    (flow/resend.py), each taken once: formation ends formed, not called off, and exact."""
    sc = _layered(relays, stages, seed, 4)
    got = run_gwtf(sc, seed=seed, formation="scaling", scale_loss=loss)
    _exact(sc, got)
    assert got.extra["scaled_over"] == ["formed"] and got.extra["lost"] > 0
    assert got.extra["resent"] >= got.extra["lost"] // 2 and got.extra["messages_by_type"]["ScaleNack"] > 0
    lossless = run_gwtf(sc, seed=seed, formation="scaling")
    assert lossless.extra["lost"] == lossless.extra["resent"] == lossless.extra["duplicates"] == 0


def test_resender_numbers_takes_once_and_asks_for_gaps():
    from gwtf_node.protocol.flow.resend import MAX_AHEAD, RENACK_S, Resender

    a, b = Resender(), Resender()
    sent = a.number([Send("b", ScaleCredit(f"1/{n}")) for n in range(1, 6)] + [SetTimer("k", 1.0)])
    assert [e.msg.seq for e in sent[:5]] == [1, 2, 3, 4, 5] and sent[5] == SetTimer("k", 1.0)
    assert a.number(sent[:1]) == sent[:1]  # one sent again keeps its number
    assert b.take(0.0, "a", 1) == (True, [])
    assert b.take(0.0, "a", 1) == (False, [Send("a", ScaleNack((), ack=1))]) and b.duplicates == 1  # acknowledged
    assert b.take(1.0, "a", 4) == (True, [Send("a", ScaleNack((2, 3)))])  # 2 and 3 were lost
    assert b.take(2.0, "a", 5) == (True, [])  # asked for less than RENACK_S ago
    assert b.take(1.0 + RENACK_S, "a", 5)[0] is False
    again = a.nacked("b", ScaleNack((2, 3, 99)))  # (99 was never sent)
    assert [e.msg for e in again] == [sent[1].msg, sent[2].msg] and a.resent == 2
    assert [b.take(9.0, "a", e.msg.seq)[0] for e in again] == [True, True] and b.upto["a"] == 5
    assert b.take(9.0, "a", 5 + MAX_AHEAD + 1) == (False, []) and b.refused == 1
    # a probe says how many it sent: the last one lost leaves no gap behind it, the probe shows it
    assert b.probed(10.0, "a", ScaleProbe(0, 6), "d", "b") == [Send("a", ScaleNack((6,)))]
    # probed by the data node, a node sends its last message again to every peer it sent one
    c = Resender()
    c.number([Send("x", ScaleCredit("1")), Send("d", ScaleCredit("1/2")), Send("d", ScaleCredit("1/3"))])
    assert [(e.to, e.msg.seq) for e in c.probed(0.0, "d", ScaleProbe(3, 0), "d", "c")] == [("d", 2), ("x", 1)]
    assert [(e.to, e.msg.seq) for e in c.probed(0.0, "x", ScaleProbe(3, 0), "d", "c")] == [("x", 1)]
    assert c.probe(("x", "y"), 3) == [Send("x", ScaleProbe(3, 1)), Send("y", ScaleProbe(3, 0))]
    # a peer that got it twice says how far it took them: probes send it no more
    x = Resender()
    assert x.take(0.0, "c", 1) == (True, [])
    (ack,) = x.take(0.0, "c", 1)[1]
    assert c.nacked("x", ack.msg) == [] and c.acked["x"] == 1
    assert [(e.to, e.msg.seq) for e in c.probed(1.0, "d", ScaleProbe(3, 0), "d", "c")] == [("d", 2)]


def test_the_data_node_makes_sure_every_node_hears_of_the_end():
    """The data node's ScaleDone to a relay is lost: the formed data node probes the relay, which has not
    acknowledged it, the relay asks for it, and acknowledges it; then the data node stops probing."""
    from gwtf_node.protocol.flow.scaled import GIVE_UP
    from gwtf_node.protocol.flow.scaling import machine_for

    cfg = FlowConfig("d", True, 2, ("d",), {"r": 3.0}, {"r": 4.0}, ())
    data = ScaledNode(FlowNode(cfg, random.Random(0)), machine_for(cfg, {"r": 2}, ("r",), 1))
    rcfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    relay = ScaledNode(FlowNode(rcfg, random.Random(0)), ScalingMachine("r", own_arcs(rcfg, 0), "d"))

    def sends(eff, to):
        return [e.msg for e in eff if isinstance(e, Send) and e.to == to]

    to_relay, t, lost = sends(data.start(0.0), "r"), 0.0, []
    relay.start(0.0)
    while to_relay:  # in flight, in order; the ScaleDone is lost
        t += 0.01
        to_data = []
        for msg in to_relay:
            if isinstance(msg, ScaleDone):
                lost.append(msg)
            else:
                to_data += sends(relay.on_message(t, "d", msg), "d")
        to_relay = [m for msg in to_data for m in sends(data.on_message(t, "r", msg), "r")]
    assert data.handed is not None and relay.handed is None and len(lost) == 1
    eff = data.on_timer(t + 10.0, GIVE_UP)
    (probe,) = sends(eff, "r")
    assert probe == ScaleProbe(data.scaling.phase, lost[0].seq) and SetTimer(GIVE_UP, t + 30.0) in eff
    # (and its own last, if not acknowledged; and, having taken something since, a probe that says work goes on)
    answer = sends(relay.on_message(t + 10.0, "d", probe), "d")
    (nack,) = [m for m in answer if isinstance(m, ScaleNack)]
    assert nack == ScaleNack((lost[0].seq,))
    (again,) = sends(data.on_message(t + 10.0, "r", nack), "r")
    assert replace(again, ack=0) == replace(lost[0], ack=0)
    (ack,) = sends(relay.on_message(t + 10.0, "d", again), "d")
    assert relay.handed == t + 10.0 and not relay.aborted and isinstance(ack, ScaleCredit)
    sent_r = data.formation.units()[1]["d"]["r"]
    assert sent_r > 0 and relay.formation.units() == ({"d": {"d": sent_r}}, {"d": {"d": sent_r}})
    assert data.on_message(t + 10.0, "r", ack) == [] and data.on_timer(t + 30.0, GIVE_UP) == []  # acknowledged


def test_work_the_data_node_cannot_see_keeps_it_from_calling_formation_off():
    """A relay that took something new since the data node's last probe answers it: the data node hears nothing
    new itself (a long chain of pushes elsewhere), but does not call formation off while work goes on."""
    from gwtf_node.protocol.flow.scaled import GIVE_UP, STALL_S
    from gwtf_node.protocol.flow.scaling import machine_for

    cfg = FlowConfig("d", True, 2, ("d",), {"r": 3.0}, {"r": 4.0}, ())
    host = ScaledNode(FlowNode(cfg, random.Random(0)), machine_for(cfg, {"r": 2}, ("r",), 1))
    host.start(0.0)
    host.on_message(STALL_S - 10.0, "r", ScaleProbe(1, 0))  # the relay's answer to a probe: work goes on
    t = STALL_S
    while not host.aborted:  # it goes on probing, and calls formation off STALL_S after the relay's answer
        t = next(e.deadline for e in host.on_timer(t, GIVE_UP) if isinstance(e, SetTimer))
    assert host.handed == 2 * STALL_S - 10.0

    rcfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    relay = ScaledNode(FlowNode(rcfg, random.Random(0)), ScalingMachine("r", own_arcs(rcfg, 0), "d"))
    relay.start(0.0)
    assert not any(isinstance(e.msg, ScaleProbe) for e in relay.on_message(1.0, "d", ScaleProbe(0, 0)))  # idle
    relay.on_message(2.0, "d", ScalePhase(1, 4, "1/2", 5, seq=1))
    answer = [e for e in relay.on_message(3.0, "d", ScaleProbe(1, 1)) if isinstance(e.msg, ScaleProbe)]
    assert [e.to for e in answer] == ["d"] and relay.formation.heard == 3.0


def test_a_node_that_comes_after_formation_is_told_and_starts_its_flow_machine():
    """A relay the data node hears of after formation is over was not part of it: the data node tells it so, and it
    starts its flow machine at once (with no units) instead of waiting for a first phase for GIVE_UP_S."""
    from gwtf_node.protocol.flow.scaled import GIVE_UP, STALL_S
    from gwtf_node.protocol.flow.scaling import machine_for

    cfg = FlowConfig("d", True, 2, ("d",), {"r": 3.0}, {"r": 4.0}, ())
    data = ScaledNode(FlowNode(cfg, random.Random(0)), machine_for(cfg, {"r": 2}, ("r",), 1))
    data.start(0.0)
    t = STALL_S
    while not data.aborted:
        t = next(e.deadline for e in data.on_timer(t, GIVE_UP) if isinstance(e, SetTimer))
    assert data.formation.late(t, "r") == [] and data.formation.late(t, "d") == []  # part of it; itself
    sends = [e for e in data.formation.late(t, "x") if isinstance(e, Send)]
    assert [(e.to, type(e.msg), e.msg.seq) for e in sends] == [("x", ScaleAbort, 1)]
    assert data.formation.late(t, "x") == []  # told once (then probed for until it acknowledges)
    xcfg = FlowConfig("x", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    late = ScaledNode(FlowNode(xcfg, random.Random(0)), ScalingMachine("x", own_arcs(xcfg, 0), "d"))
    late.start(t)
    (ack,) = [e for e in late.on_message(t + 1.0, "d", sends[0].msg) if isinstance(e, Send) and e.to == "d"]
    assert late.handed == t + 1.0 and late.formation.units() == ({}, {}) and isinstance(ack.msg, ScaleCredit)


def test_a_relay_that_calls_formation_off_makes_the_data_node_tell_every_node():
    """A relay that saw a neighbour leave tells the data node (`ScaleAbort`); the data node calls formation off and
    tells every node (in the daemon also when the relay's word came before the data node opened formation: it is
    held, flows.py `scale_queue`, and taken once formation opens)."""
    from gwtf_node.protocol.flow.scaling import machine_for

    cfg = FlowConfig("d", True, 2, ("d",), {"r": 3.0, "q": 5.0}, {"r": 4.0, "q": 6.0}, ())
    host = ScaledNode(FlowNode(cfg, random.Random(0)), machine_for(cfg, {"r": 2, "q": 1}, ("q", "r"), 1))
    host.start(1.0)
    eff = host.on_message(2.0, "r", ScaleAbort("x left during formation", seq=1))
    assert host.aborted and host.handed == 2.0
    told = [e for e in eff if isinstance(e, Send) and isinstance(e.msg, ScaleAbort)]
    assert sorted(e.to for e in told) == ["q", "r"] and all(e.msg.reason.startswith("r: x left") for e in told)
    again = host.on_message(3.0, "q", ScaleAbort("y left during formation", seq=1))
    assert not any(isinstance(e, Send) and isinstance(e.msg, ScaleAbort) for e in again)  # over: told once


def test_a_relay_that_gets_flow_messages_before_a_first_phase_starts_its_flow_machine_at_once():
    """Its neighbours form their flows without scaled formation (several data nodes): a relay that gets a flow
    message before any phase hands over with no units at once and takes the message; after a first phase a flow
    message changes nothing of formation (it is held for the handover)."""
    rcfg = FlowConfig("r", False, 2, ("d",), {"d": 3.0}, {"d": 4.0}, ())
    label = CostAnnounce((Label("d", Side.IN, 7.0, ("d",), 1),))
    relay = ScaledNode(FlowNode(rcfg, random.Random(0)), ScalingMachine("r", own_arcs(rcfg, 0), "d"))
    relay.start(0.0)
    relay.on_message(2.0, "d", label)
    assert relay.handed == 2.0 and relay.aborted and relay.formation.units() == ({}, {}) and relay.held == []
    assert "d forms its flows without scaled formation" in relay.formation.why
    assert relay.flow.labels.lin["d"]["d"].cost == 7.0  # the flow machine took the message

    from gwtf_node.protocol.flow.scaling import machine_for
    dcfg = FlowConfig("d", True, 2, ("d",), {"r": 3.0}, {"r": 4.0}, ())
    data = ScaledNode(FlowNode(dcfg, random.Random(0)), machine_for(dcfg, {"r": 2}, ("r",), 1))
    phase = next(e.msg for e in data.start(0.0) if isinstance(e, Send) and isinstance(e.msg, ScalePhase))
    relay = ScaledNode(FlowNode(rcfg, random.Random(0)), ScalingMachine("r", own_arcs(rcfg, 0), "d"))
    relay.start(0.0)
    relay.on_message(1.0, "d", phase)
    relay.on_message(2.0, "d", label)
    assert relay.handed is None and relay.held == [("d", label)]
