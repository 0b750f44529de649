"""Pooled formation and homing in the simulator (sim/pooled.py, protocol/flow/pool.py)."""

from __future__ import annotations

import random

import pytest

from gwtf_node.protocol.flow import FlowNode
from gwtf_node.protocol.flow.pool import PoolMachine
from gwtf_node.protocol.homingmsgs import CostReply, TraceUnit
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.engine import Simulator
from gwtf_node.sim.flowchurn import Churn, changed_scenario
from gwtf_node.sim.flowsim import MS, extract_flows, flow_configs
from gwtf_node.sim.pooled import POOL_ID, handover, installed_flows, pool_configs, pooled_scenario, run_pooled, sink_of
from gwtf_node.sim.scenarios import load_flow_setting
from gwtf_node.sim.validate import check_routing


def ratio(sc, res, seed):
    o = optimal_routing(sc, seed=seed)
    return sum(f.cost for f in res.flows) / o.extra.get("lp_bound_total_cost", o.total_cost), o


@pytest.mark.parametrize("setting, seed", [(5, 0), (6, 209)])
def test_several_data_nodes_end_home_within_8_percent_of_the_lp_bound(setting, seed):
    sc = load_flow_setting(setting, seed)
    res = run_pooled(sc, seed=seed)
    check_routing(sc, res)  # every unit from its data node back to it, capacities held
    r, o = ratio(sc, res, seed)
    assert res.extra["homed"] and res.extra["unrouted_relays"] == 0
    assert res.num_flows == round(o.extra["lp_max_flow"])
    assert res.extra["traced"] == res.num_flows
    assert r <= 1.08, r


def test_with_one_data_node_pooled_formation_is_the_optimum():
    sc = load_flow_setting(1, 3)
    res = run_pooled(sc, seed=3)
    o = optimal_routing(sc, seed=3)
    check_routing(sc, res)
    assert res.num_flows == o.num_flows
    assert sum(f.cost for f in res.flows) == pytest.approx(o.total_cost)
    assert res.extra["crossed"] == 0 and res.extra["swaps"] == 0


class DropFirst:
    """A machine that loses the first message of type `kind` delivered to it."""

    def __init__(self, machine, kind):
        self.machine, self.kind, self.dropped = machine, kind, 0

    def start(self, now):
        return self.machine.start(now)

    def on_timer(self, now, key):
        return self.machine.on_timer(now, key)

    def on_message(self, now, sender, msg):
        if type(msg) is self.kind and not self.dropped:
            self.dropped += 1
            return []
        return self.machine.on_message(now, sender, msg)


@pytest.mark.parametrize("victim, kind", [("pool", TraceUnit), ("pool", CostReply)])
def test_a_lost_trace_or_reply_times_the_round_out_and_the_next_one_homes(victim, kind):
    sc = load_flow_setting(5, 0)
    net = pooled_scenario(sc)
    cfgs, pcfgs = flow_configs(net), pool_configs(sc)
    sim = Simulator(lambda a, b: (lambda v: None if v is None else v * MS)(net.delay_ms(a, b)))
    machines = {nid: PoolMachine(FlowNode(cfgs[nid], random.Random(f"0:{nid}")), pcfgs[nid]) for nid in cfgs}
    lossy = DropFirst(machines[victim], kind)
    for nid in sorted(machines):
        sim.add(nid, lossy if nid == victim else machines[nid])
    sim.start_all()
    sim.run_until(200.0, stop=lambda now: machines[POOL_ID].homed, check_every_s=1.0)
    assert lossy.dropped == 1
    assert machines[POOL_ID].homed and machines[POOL_ID].stats.rounds == 2
    flows, left = installed_flows(sc, machines)
    check_routing(sc, flows)
    assert left == 0 and len(flows) == round(optimal_routing(sc, seed=0).extra["lp_max_flow"])


def test_messages_of_an_old_round_or_from_a_peer_not_asked_change_nothing():
    sc = load_flow_setting(5, 0)
    res = run_pooled(sc, seed=0)
    assert res.extra["homed"]
    net = pooled_scenario(sc)
    cfg = flow_configs(net)[POOL_ID]
    pool = PoolMachine(FlowNode(cfg, random.Random(0)), pool_configs(sc)[POOL_ID])
    pool.start(0.0)
    assert pool.on_message(1.0, "r0", CostReply(0, (("x", 1.0),))) == []
    assert pool.on_message(1.0, sink_of("d0"), TraceUnit(5, "d0", ("a",), "d0")) == []
    assert not pool.homed and pool.costs == {} and pool.tokens == []


def test_sim_flow_pooled_prints_the_homed_flows_and_refuses_other_policies(tmp_path, capsys):
    import json

    from gwtf_node.cli import main
    from gwtf_node.sim.scenarios import flow_setting_scenario

    sc = tmp_path / "s5.json"
    sc.write_text(json.dumps(flow_setting_scenario(5, 0)))
    assert main(["sim", "flow", "--scenario", str(sc), "--seed", "0", "--pooled", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert res["policy"] == "gwtf" and res["formation"] == "pooled" and res["homed"]
    assert all(f["path"] and f["data_node"] in ("d0", "d1") for f in res["flows"])
    check_routing(load_flow_setting(5, 0), run_pooled(load_flow_setting(5, 0), seed=0))
    assert main(["sim", "flow", "--scenario", str(sc), "--policy", "swarm", "--pooled"]) == 2
    assert "--pooled" in capsys.readouterr().err


def test_the_per_data_node_machines_run_on_from_the_homed_units_and_keep_them():
    sc = load_flow_setting(6, 201)
    homed = run_pooled(sc, seed=201)
    on = run_pooled(sc, seed=201, continue_rounds=40)
    check_routing(sc, on)
    assert on.extra["inconsistent_links"] == 0 and on.extra["continued_messages"] > 0
    assert sorted((f.data_node, f.path) for f in on.flows) == sorted((f.data_node, f.path) for f in homed.flows)


def _homed(sc, until_s: float) -> dict[str, PoolMachine]:
    """The pooled machines of `sc`, run until the pool has homed the units (at most `until_s`)."""
    net = pooled_scenario(sc)
    cfgs, pcfgs = flow_configs(net), pool_configs(sc)
    sim = Simulator(lambda a, b: (lambda v: None if v is None else v * MS)(net.delay_ms(a, b)))
    machines = {nid: PoolMachine(FlowNode(cfgs[nid], random.Random(f"0:{nid}")), pcfgs[nid]) for nid in cfgs}
    for nid in sorted(machines):
        sim.add(nid, machines[nid])
    sim.start_all()
    sim.run_until(until_s, stop=lambda now: machines[POOL_ID].homed, check_every_s=1.0)
    return machines


def _started(sc, nodes: dict[str, FlowNode]) -> Simulator:
    """A simulator of `sc` that runs the per-data-node machines `handover` gave, started."""
    after = Simulator(lambda a, b: (lambda v: None if v is None else v * MS)(sc.delay_ms(a, b)))
    for nid in sorted(nodes):
        after.add(nid, nodes[nid])
    after.start_all()
    return after


def test_after_the_handover_a_crashed_relay_s_units_are_placed_again():
    sc = load_flow_setting(5, 0)
    nodes = handover(sc, _homed(sc, 200.0))
    after = _started(sc, nodes)
    after.run_until(10.0)
    victim = next(r for r in sorted(nodes) if not nodes[r].cfg.is_data and any(nodes[r].out[d] for d in nodes[r].out))
    after.kill(victim)
    for nid in sorted(set(nodes[victim].cfg.next_costs) | set(nodes[victim].cfg.prev_costs)):
        after._apply(nid, nodes[nid].remove_neighbour(after.now, victim))
    after.run_until(120.0)
    rest = [f for f in extract_flows(sc, nodes)[0]]
    assert all(victim not in f.path for f in rest)
    without = sc.__class__(sc.name, sc.stages, tuple(n for n in sc.nodes if n.id != victim),
                           tuple(l for l in sc.links if victim not in (l.a, l.b)))
    check_routing(without, rest)
    assert len(rest) == round(optimal_routing(without, seed=0).extra["lp_max_flow"])


@pytest.mark.parametrize("setting, seed", [(5, 0), (6, 201)])
def test_a_relay_that_crashes_while_the_flows_form_is_routed_around(setting, seed):
    sc = load_flow_setting(setting, seed)
    calm = run_pooled(sc, seed=seed)
    used = sorted({r for f in calm.flows for r in f.path})
    victim = used[len(used) // 2]  # a relay the flows formed without churn use
    res = run_pooled(sc, seed=seed, kill=(victim,), kill_at_s=0.6 * calm.extra["homed_at"])
    after = changed_scenario(sc, Churn(kill=(victim,)))
    check_routing(after, res)
    assert res.extra["homed"] and res.extra["unrouted_relays"] == 0
    assert all(victim not in f.path for f in res.flows)
    r, o = ratio(after, res, seed)
    assert res.num_flows == round(o.extra["lp_max_flow"]), (res.num_flows, o.extra["lp_max_flow"])
    assert r <= 1.35, r  # re-formed after a crash, not exact: as the flow machines re-form (bench_flow_churn.py)


@pytest.mark.slow
def test_table6_x8_places_the_maximum_flow_and_homes_it():
    # Table VI x8 (24 data nodes, 5 stages of 24 relays): a relay held the pool's launch for good here, waiting for
    # still labels while the stuck timer's waves kept coming, until a unit whose wait a new wave cut short waited
    # only for the previous wave's lowest label (flow/waves.py)
    from gwtf_node.sim.baselines import max_flow_value
    from gwtf_node.sim.train.setting import flow_scenario, make_table6

    sc = flow_scenario(make_table6(8, 0))
    res = run_pooled(sc, seed=0, rounds=300)
    check_routing(sc, res)
    assert res.extra["homed"] and res.extra["held"] == 0 and res.extra["unrouted_relays"] == 0
    assert res.num_flows == res.extra["traced"] == max_flow_value(sc)


def test_a_launch_held_for_good_is_traced_ended_nowhere_and_the_pool_homes_without_it():
    from gwtf_node.protocol.flow.pool import STALLED, PoolConfig

    sc = load_flow_setting(5, 0)
    net = pooled_scenario(sc)
    cfgs, pcfgs = flow_configs(net), pool_configs(sc)
    pool = PoolMachine(FlowNode(cfgs[POOL_ID], random.Random(0)), pcfgs[POOL_ID])
    pool.inner.launch.pending = 1  # a launch out, and the pool's flows unchanged since 0 s
    stall = pool.pcfg.stall_s
    assert pool._formed(stall - 1.0) == "" and pool._formed(stall) == STALLED
    relay = sorted(n.id for n in sc.relays)[0]
    r = PoolMachine(FlowNode(cfgs[relay], random.Random(0)), pcfgs[relay])
    prev = sorted(cfgs[relay].prev_costs)[0]
    r.inner.units.inn[POOL_ID][prev] = 1  # the unit it holds: none of its own goes on
    eff = r.on_message(1.0, prev, TraceUnit(1, "d0", ()))
    assert [(e.to, e.msg) for e in eff] == [(POOL_ID, TraceUnit(1, "d0", (relay,)))]
    assert eff[0].msg.end == "" and pcfgs[relay] == PoolConfig("relay")


@pytest.mark.slow
def test_after_the_handover_of_table6_x8_seed_3_the_labels_settle():
    # the homed units are a maximum flow but no per-data-node optimum: crossing labels went round a negative
    # cycle, cut by the path check at a different place each time, and last-stage relays announced two routes
    # of one cost in turn for as long as the run went (relabel.py `adopted`)
    from gwtf_node.sim.train.setting import flow_scenario, make_table6, swarm_placement

    sc = flow_scenario(swarm_placement(make_table6(8, 3)))
    machines = _homed(sc, 300.0)
    homed = installed_flows(sc, machines)[0]
    nodes = handover(sc, machines)
    after = _started(sc, nodes)
    limit = 60_000  # (17,032 in all here; the flap sent about 8,000 a second)
    after.run_until(20.0, stop=lambda now: after.stats.messages > limit, check_every_s=0.5)
    settled = after.stats.messages
    after.run_until(40.0, stop=lambda now: after.stats.messages > limit, check_every_s=0.5)
    assert settled <= limit and after.stats.messages - settled < 100, (settled, after.stats.messages)
    flows = extract_flows(sc, nodes)[0]
    check_routing(sc, flows)
    assert sorted((f.data_node, f.path) for f in flows) == sorted((f.data_node, f.path) for f in homed)
