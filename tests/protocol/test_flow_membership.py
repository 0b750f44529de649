"""Membership changes of the flow machine: add_neighbour / remove_neighbour / set_cost, alone and in the simulator."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.flow.state import Via
from gwtf_node.protocol.messages import CostAnnounce, Deny, DenyReason, Label, RequestFlow, Side, Withdraw
from gwtf_node.protocol.scenario import LinkSpec, NodeSpec, parse_scenario
from gwtf_node.sim.baselines import max_flow_value, optimal_routing
from gwtf_node.sim.flowchurn import Churn, FlowRun, random_churn, run_churn, run_trickle
from gwtf_node.sim.scenarios import FlowSetting, generate_layered, load_flow_setting
from gwtf_node.sim.validate import check_routing
from support.helpers import flow_relay as relay, sends

D = "d0"


# ------------------------------------------------------------------ the machine alone
def test_bad_side_is_refused():
    with pytest.raises(ValueError):
        relay().add_neighbour(0.0, "X", 1.0, "sideways")


def test_remove_next_unpairs_units_and_reroutes_them():
    m = relay(nxt={"N1": 1.0, "N2": 5.0})
    m.on_message(0.1, "N1", CostAnnounce((Label(D, Side.IN, 1.0, ("N1+", "N1-", D + "+")),)))
    m.on_message(0.1, "N2", CostAnnounce((Label(D, Side.IN, 1.0, ("N2+", "N2-", D + "+")),)))
    m.inn[D] = {"P1": 1}
    m.out[D] = {"N1": 1}
    eff = m.remove_neighbour(1.0, "N1")
    assert "N1" not in m.cfg.next_costs and m.out[D] == {} and m.token_pending  # the unit is unpaired again
    req = sends(eff, RequestFlow, "N2")
    assert len(req) == 1 and not req[0].msg.forced  # re-routed along the OUT label, at once
    # a late message of the removed peer is ignored
    assert m.on_message(1.1, "N1", Deny(D, DenyReason.NO_ROUTE)) == [] and m.stats.ignored >= 1


def test_remove_prev_withdraws_downstream():
    m = relay()
    m.inn[D] = {"P1": 1}
    m.out[D] = {"N1": 1}
    eff = m.remove_neighbour(1.0, "P1")
    assert m.inn[D] == {} and len(sends(eff, Withdraw, "N1")) == 1


def test_remove_unknown_peer_is_a_no_op():
    m = relay()
    assert m.remove_neighbour(1.0, "ZZ") == [] and "ZZ" not in m.removed


def test_add_prev_sends_our_in_labels_and_stash_is_used_on_add_next():
    m = relay()
    m.on_message(0.1, "N1", CostAnnounce((Label(D, Side.IN, 2.0, ("N1+", "N1-", D + "+"), epoch=3),)))
    assert m.my_in[D].cost == 3.0
    eff = m.add_neighbour(1.0, "P2", 4.0, "prev")
    ann = sends(eff, CostAnnounce, "P2")
    assert len(ann) == 1 and ann[0].msg.labels[0].cost == 3.0 and ann[0].msg.labels[0].epoch == 3
    assert m.cfg.prev_costs["P2"] == 4.0 and m.change_moves_until > 1.0
    # a newcomer's label that arrives before we are told about it is kept and used once it is added
    m.on_message(1.1, "N9", CostAnnounce((Label(D, Side.IN, 0.5, ("N9+", "N9-", D + "+"), epoch=3),)))
    assert m.my_in[D].cost == 3.0
    m.add_neighbour(1.2, "N9", 1.0, "next")
    assert m.my_in[D].cost == 1.5 and m.dec_in[D] == (Via.FORWARD, "N9")


def test_set_cost_moves_the_label():
    m = relay()
    m.on_message(0.1, "N1", CostAnnounce((Label(D, Side.IN, 2.0, ("N1+", "N1-", D + "+")),)))
    m.set_cost(1.0, "N1", 5.0)
    assert m.cfg.next_costs["N1"] == 5.0 and m.my_in[D].cost == 7.0


# Both ends of a link measured it themselves (the daemon's RTT): a link's cost at its upstream end (next_costs)
# and at its downstream end (prev_costs).  Measured in a CI run whose flows placed 2 of 4 units and stayed there.
_MEASURED = {("d0", "r0_1"): (0.773, 1.325), ("d0", "r0_0"): (0.85, 3.903), ("r0_0", "r1_0"): (3.457, 7.818),
             ("r0_0", "r1_1"): (3.759, 5.29), ("r0_1", "r1_0"): (4.412, 6.307), ("r0_1", "r1_1"): (5.146, 5.666),
             ("r1_0", "d0"): (6.528, 0.741), ("r1_1", "d0"): (1.649, 0.726)}


@pytest.mark.parametrize("agree_at", [0.0, 0.3, 3.0])
def test_link_costs_agreed_by_the_upstream_end_place_the_whole_demand(agree_at):
    """The daemon's LinkCost: the downstream end adopts the upstream end's cost (`set_cost`), here before the
    machines start or after they placed part of the demand; then the whole demand is placed (4 units over two
    disjoint paths of capacity 2), whatever each end measured first."""
    from gwtf_node.sim.engine import Simulator

    names = ("d0", "r0_0", "r0_1", "r1_0", "r1_1")
    for seed in range(3):
        sim = Simulator(lambda a, b: 0.001)
        nodes = {}
        for n in names:
            nxt = {b: up for (a, b), (up, _) in _MEASURED.items() if a == n}
            prv = {a: down for (a, b), (_, down) in _MEASURED.items() if b == n}
            peers = () if n == "d0" else tuple(p for p in names if p != n and p[:2] == n[:2])
            nodes[n] = FlowNode(FlowConfig(n, n == "d0", 4 if n == "d0" else 2, ("d0",), nxt, prv, peers),
                                random.Random(seed))
            sim.add(n, nodes[n])
        sim.start_all()
        sim.run_until(agree_at)
        for (a, b), (up, _) in sorted(_MEASURED.items()):
            sim._apply(b, nodes[b].set_cost(sim.now, a, up))
        sim.run_until(agree_at + 20.0)
        assert dict(nodes["d0"].out["d0"]) == {"r0_0": 2, "r0_1": 2}, (seed, dict(nodes["d0"].out["d0"]))


def test_peer_add_and_remove():
    m = relay(peers=("S1",))
    m.add_neighbour(0.5, "S2", 0.0, "peer")
    assert m.cfg.peers == ("S1", "S2")
    m.remove_neighbour(0.6, "S1")
    assert m.cfg.peers == ("S2",)


def test_data_node_removal_replaces_demand_with_a_new_wave():
    cfg = FlowConfig(D, True, 2, (D,), {"A": 1.0, "B": 3.0}, {"Z": 1.0})
    m = FlowNode(cfg, random.Random(0))
    m.start(0.0)
    e0 = m.epoch[D]
    m.out[D] = {"A": 2}
    m.launch.pending = 1
    eff = m.remove_neighbour(1.0, "A")
    assert m.out[D] == {} and m.launch.pending == 0 and m.epoch[D] == e0 + 1
    assert any(l.epoch == e0 + 1 for a in sends(eff, CostAnnounce, "Z") for l in a.msg.labels)


def test_unit_not_launched_reaching_the_sink_does_not_presettle_the_next_launch():
    cfg = FlowConfig(D, True, 2, (D,), {"A": 1.0}, {"Z": 1.0})
    m = FlowNode(cfg, random.Random(0))
    m.start(0.0)
    e0 = m.epoch[D]
    # a unit re-routed after a removal arrives while no launch is outstanding: a new wave, but nothing settled
    m.on_message(1.0, "Z", RequestFlow(7, D, 0.0))
    assert m.epoch[D] == e0 + 1 and m.launch.pending == 0 and m.inn[D] == {"Z": 1}
    # the launch in flight reaching the sink before its approval is back still counts (-1, then 0)
    m.units.token_pending = True
    m.on_message(2.0, "Z", RequestFlow(8, D, 0.0))
    assert m.launch.pending == -1


# ------------------------------------------------------------------ in the simulator
def sc_of(nodes, links, stages=2):
    return parse_scenario({"name": "t", "stages": stages, "nodes": nodes, "links": links})


def data(cap):
    return {"id": D, "role": "data", "capacity": cap}


def rl(i, stage, cap):
    return {"id": i, "role": "relay", "stage": stage, "capacity": cap}


def ln(a, b, c):
    return {"a": a, "b": b, "cost": c}


def check_after(res, exact_cost=True):
    new = res.changed
    check_routing(new, res.after)
    assert res.after.extra["inconsistent_links"] == 0 and not res.extra["stuck"]
    assert res.after.num_flows == max_flow_value(new)
    if exact_cost and res.after.flows:
        assert res.after.total_cost == pytest.approx(optimal_routing(new).total_cost)


def test_remove_relay_on_the_only_path():
    sc = sc_of([data(2), rl("a", 0, 2), rl("b", 1, 2)], [ln(D, "a", 1), ln("a", "b", 1), ln("b", D, 1)])
    res = run_churn(sc, Churn(kill=("b",)), rounds=60)
    assert res.before.num_flows == 2
    check_after(res)
    assert res.after.num_flows == 0


def test_remove_relay_on_one_of_several_paths():
    sc = sc_of([data(3), rl("a", 0, 3), rl("b", 1, 2), rl("c", 1, 3)],
               [ln(D, "a", 1), ln("a", "b", 1), ln("a", "c", 5), ln("b", D, 1), ln("c", D, 5)])
    res = run_churn(sc, Churn(kill=("b",)), rounds=60)
    assert res.before.num_flows == 3
    check_after(res)
    assert res.after.num_flows == 3 and all(f.path == ("a", "c") for f in res.after.flows)


def join(i, stage, cap, links):
    return Churn(join=(NodeSpec(i, "relay", cap, stage),),
                 join_links=tuple(LinkSpec(a, b, float(c), (float(c), float(c))) for a, b, c in links))


def test_newcomer_gets_flow_when_capacity_was_the_bottleneck():
    sc = sc_of([data(3), rl("a", 0, 3), rl("b", 1, 1)], [ln(D, "a", 1), ln("a", "b", 1), ln("b", D, 1)])
    res = run_churn(sc, join("n", 1, 2, [("a", "n", 4), ("n", D, 4)]), rounds=60)
    assert res.before.num_flows == 1
    check_after(res)
    assert res.after.num_flows == 3 and sum("n" in f.path for f in res.after.flows) == 2


def test_flows_move_to_a_cheaper_newcomer():
    sc = sc_of([data(2), rl("a", 0, 2), rl("b", 1, 2)], [ln(D, "a", 1), ln("a", "b", 9), ln("b", D, 9)])
    res = run_churn(sc, join("n", 1, 2, [("a", "n", 1), ("n", D, 1)]), rounds=60)
    check_after(res)
    assert all(f.path == ("a", "n") for f in res.after.flows)


def test_several_data_nodes_kill_relays():
    sc = load_flow_setting(5, 0)
    ch = random_churn(sc, random.Random(5), kill_frac=0.1)
    res = run_churn(sc, ch, seed=0, rounds=80)
    new = res.changed
    check_routing(new, res.after)
    assert res.after.extra["inconsistent_links"] == 0 and not res.extra["stuck"]
    for d in (n.id for n in new.data_nodes):  # every data node is served again
        assert any(f.data_node == d for f in res.after.flows)
    assert res.after.num_flows >= 0.9 * optimal_routing(new).extra.get("lp_max_flow", 0)


@pytest.mark.parametrize("seed", [0, 2])
def test_relays_that_join_while_the_flows_form_reach_the_optimum(seed):
    """Six of 160 relays (8 stages) join one a second while the flows form (`run_trickle`): the formation waves
    go on (waves.py `defer`), and the flows end at the maximum flow with the optimum's cost."""
    sc = parse_scenario(generate_layered(f"t{seed}", FlowSetting(1, 160, 8, (1, 3), (1, 20)), seed))
    late = random.Random(20_000 + seed).sample(sorted(r.id for r in sc.relays), 6)
    res = run_trickle(sc, late, 1.0, 1.0, seed=seed, rounds=60, formation="waves", neighbours=0)
    check_routing(sc, res)
    opt = optimal_routing(sc)
    assert res.num_flows == opt.num_flows
    assert res.mean_cost == pytest.approx(opt.mean_cost)


def test_table_v_setting1_kill_reaches_new_max_flow():
    sc = load_flow_setting(1, 7)
    res = run_churn(sc, random_churn(sc, random.Random(1007), kill_frac=0.1), seed=7)
    check_after(res, exact_cost=False)
    assert res.after.mean_cost <= 1.25 * optimal_routing(res.changed).mean_cost


# ------------------------------------------------------------------ random add/remove sequences
@st.composite
def small_layered(draw):
    s = draw(st.integers(1, 3))
    nodes = [data(draw(st.integers(1, 5)))]
    links = []
    by_stage = []
    for stage in range(s):
        ids = [f"r{stage}_{k}" for k in range(draw(st.integers(1, 3)))]
        by_stage.append(ids)
        nodes += [rl(i, stage, draw(st.integers(0, 3))) for i in ids]
    for r in by_stage[0]:
        links.append(ln(D, r, draw(st.integers(1, 20))))
    for r in by_stage[-1]:
        if s > 1:
            links.append(ln(r, D, draw(st.integers(1, 20))))
    for k in range(s - 1):
        for a in by_stage[k]:
            for b in by_stage[k + 1]:
                if draw(st.integers(0, 9)) < 8:
                    links.append(ln(a, b, draw(st.integers(1, 20))))
    return {"name": "hyp", "stages": s, "nodes": nodes, "links": links}


# Found by a 1,500-example run (was a strict xfail): after the third step a unit re-routed by the removal
# reached the sink while no launch was outstanding and was counted as settling one (-1), which pre-settled the
# next launch; that unit filled a Withdraw's hole at r2_0, never reached the sink, and with nothing outstanding
# `_maybe_lost_settlement` did not fire: `next_launch` stayed at infinity, 1 flow of 2.
STUCK_LAUNCH = dict(obj={"name": "hyp", "stages": 3, "nodes": [
    data(2), rl("r0_0", 0, 0), rl("r0_1", 0, 0), rl("r0_2", 0, 0), rl("r1_0", 1, 0), rl("r1_1", 1, 1),
    rl("r2_0", 2, 2)], "links": [
    ln(D, "r0_0", 1), ln(D, "r0_1", 1), ln(D, "r0_2", 1), ln("r2_0", D, 1),
    *[ln(f"r0_{i}", f"r1_{j}", 1) for i in range(3) for j in range(2)], ln("r1_1", "r2_0", 7)]},
    seed=92, steps=[(0.0, 2), (0.375, 2), (0.5, 2)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=small_layered(), seed=st.integers(0, 1000),
       steps=st.lists(st.tuples(st.floats(0.0, 0.5), st.integers(0, 2)), min_size=1, max_size=3))
# CI: the launched unit reached a relay waiting out the grace of a Withdraw (r0_1 killed) and filled that hole;
# its settlement never reached the data node, which waited for it forever (1 flow of 2)
@example(obj={"name": "hyp", "stages": 3, "nodes": [
    data(2), rl("r0_0", 0, 0), rl("r0_1", 0, 1), rl("r0_2", 0, 0), rl("r1_0", 1, 0), rl("r1_1", 1, 2),
    rl("r1_2", 1, 0), rl("r2_0", 2, 2)], "links": [
    ln(D, "r0_0", 1), ln(D, "r0_1", 1), ln(D, "r0_2", 1), ln("r2_0", D, 1), ln("r0_0", "r1_0", 1),
    ln("r0_0", "r1_1", 1), ln("r0_0", "r1_2", 1), ln("r0_1", "r1_0", 1), ln("r0_1", "r1_1", 1),
    ln("r0_1", "r1_2", 1), ln("r0_2", "r1_0", 1), ln("r0_2", "r1_2", 1), ln("r1_1", "r2_0", 1),
    ln("r1_2", "r2_0", 1)]}, seed=197, steps=[(0.25, 1)])
@example(**STUCK_LAUNCH)
def test_random_add_remove_sequences_keep_invariants(obj, seed, steps):
    _churn_and_check(obj, seed, steps)


def test_stuck_launch_after_three_churn_steps():
    _churn_and_check(**STUCK_LAUNCH)


def _churn_and_check(obj, seed, steps):
    sc = parse_scenario(obj)
    run = FlowRun(sc, seed)
    run.run_quiet(60)
    for k, (kill_frac, joins) in enumerate(steps):
        ch = random_churn(run.scenario, random.Random(seed * 10 + k), kill_frac, joins,
                          capacity=(1, 4), detect_s=0.5, prefix=f"j{k}_")
        new = run.apply(ch)
        run.run_quiet(80)
        flows, mismatched = __import__("gwtf_node.sim.flowsim", fromlist=["extract_flows"]).extract_flows(
            new, run.nodes)
        assert mismatched == 0
        check_routing(new, flows)
        for nid, m in run.nodes.items():
            assert m.cfg.is_data or m.used() <= m.cfg.capacity
            assert not m.pending and not m.token_pending
            for d in m.cfg.commodities:
                assert m.imbalance(d) == 0
                assert all(new.has(j) for j in m.out[d]) and all(new.has(p) for p in m.inn[d])
        assert len(flows) == max_flow_value(new)


def _busiest_link(flows, data_links: bool) -> tuple[str, str]:
    use: dict[tuple[str, str], int] = {}
    for f in flows:
        hops = (f.data_node, *f.path, f.data_node)
        for a, b in zip(hops, hops[1:]):
            if (a == f.data_node or b == f.data_node) == data_links:
                use[(a, b)] = use.get((a, b), 0) + 1
    return max(use, key=lambda k: (use[k], k))


@pytest.mark.parametrize("setting,seed,data_links", [(1, 0, True), (1, 3, True), (1, 1, False), (5, 1, False),
                                                     (5, 4, True)])
def test_recost_moves_the_flows_off_a_link_that_became_dearer(setting, seed, data_links):
    """The upstream end of the busiest link measures it 10x dearer (`recost`; the downstream end hears it as
    LinkCost(reform=True) over the simulated link): the flows re-form within 8 % of the new optimum (exact
    min-cost flow with one data node, the LP bound with two) and the link carries less; with `set_cost` at both
    ends instead they stay markedly dearer."""
    from dataclasses import replace as dc_replace

    from gwtf_node.sim.baselines import optimal_routing
    from gwtf_node.sim.flowchurn import FlowRun
    from gwtf_node.sim.scenarios import load_flow_setting
    from gwtf_node.sim.validate import check_routing

    sc = load_flow_setting(setting, seed)
    outcome = {}
    for how in ("recost", "set_cost"):
        run = FlowRun(sc, seed)
        run.run_quiet(120)
        before = run.result(sc, 0, 0, 0)
        a, b = _busiest_link(before.flows, data_links)
        dearer = sc.cost(a, b) * 10
        changed = dc_replace(sc, links=tuple(dc_replace(l, cost=dearer) if {l.a, l.b} == {a, b} else l
                                             for l in sc.links))
        t0 = run.sim.now
        if how == "recost":
            run._call(a, run.nodes[a].recost(t0, b, dearer))
        else:
            run._call(a, run.nodes[a].set_cost(t0, b, dearer))
            run._call(b, run.nodes[b].set_cost(t0, a, dearer))
        run.known.append(changed)
        run.settle_from = t0
        run.run_quiet(120)
        after = run.result(changed, 0, 0, 0)
        check_routing(changed, after)
        assert after.extra["inconsistent_links"] == 0
        on_link = lambda r: sum(1 for f in r.flows for x, y in zip((f.data_node, *f.path), (*f.path, f.data_node))
                                if (x, y) == (a, b))
        opt = optimal_routing(changed, seed)
        assert after.num_flows == opt.num_flows
        outcome[how] = (after.total_cost / opt.total_cost, on_link(before), on_link(after))
    ratio, units_before, units_after = outcome["recost"]
    # (setting 1 seed 1: 1.0714, its units handed back at no cost while the flows re-form: labels.py
    # `back_candidates`; over settings 1 and 3, seeds 0-7, both links: mean 1.0339, the maximum flow on 32 of 32)
    assert ratio <= 1.08 and units_after < units_before, outcome
    # why recost exists: the new cost alone leaves the flows on the dear link (one data node) or, with the
    # improvement moves of two data nodes, well above the optimum (measured: 1.14-1.86 of it on these cases)
    assert outcome["set_cost"][0] >= ratio + 0.05, outcome


# ------------------------------------------------------------------ a partition healed
def _two_by_two():
    nodes = [data(4)] + [rl(f"r{s}_{i}", s, 2) for s in (0, 1) for i in (0, 1)]
    links = [ln(D, f"r0_{i}", 60) for i in (0, 1)] + [ln(f"r1_{i}", D, 60) for i in (0, 1)] + \
        [ln(f"r0_{i}", f"r1_{j}", 60) for i in (0, 1) for j in (0, 1)]
    return sc_of(nodes, links)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("late", [{}, {D: 5.4}, {"r1_0": 3.0, "r1_1": 4.0}, {"r0_1": 5.0}])
def test_a_relay_back_from_a_partition_carries_units_again(seed, late):
    """r0_1 is cut off for 30 s (both sides remove each other), then back: the flows use it again.  `late`: who
    adds its links to it seconds after the others (its link measurement took that long).  With the data node
    late (as seen in tests/lab/test_partition_lab.py), r0_1's announcement reached it before it had added the link;
    before `FlowNode.peer_back` that announcement was ignored as one sent before r0_1's removal, and d0's two
    units that r0_1 carried were never placed again."""
    sc = _two_by_two()
    run = FlowRun(sc, seed)
    run.run_quiet(120)
    assert sum(run.nodes[D].out[D].values()) == 4
    run.partition("r0_1")
    run.sim.run_until(run.sim.now + 30.0)
    assert dict(run.nodes[D].out[D]) == {"r0_0": 2}  # (capacity 2: the other two have no route)
    run.heal("r0_1", add_after_s={k: v + 0.3 for k, v in late.items()})
    run.run_quiet(200)
    flows, mismatched = __import__("gwtf_node.sim.flowsim", fromlist=["extract_flows"]).extract_flows(sc, run.nodes)
    assert mismatched == 0
    check_routing(sc, flows)
    assert len(flows) == 4 and dict(run.nodes[D].out[D]) == {"r0_0": 2, "r0_1": 2}
    assert all(not m.pending and not m.token_pending for m in run.nodes.values())
