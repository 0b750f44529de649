"""`scripts/diag_flow_multi.py` on setting 5 seed 0 (two data nodes): the flow machines end 13 cost units above
the multi-commodity LP bound (330 against 317) at a local optimum of their moves (one commodity re-routed alone,
relabelling, two units exchanging routes: no gain), and re-routing both data nodes' units together closes the
whole gap.  When the flow machines change on this instance, the figures of docs/bench_flow.md change with them."""

from __future__ import annotations

from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import flow_setting_scenario

from support.helpers import load_script


def _diag():
    return load_script("diag_flow_multi")


def test_setting5_seed0_is_a_local_optimum_that_a_joint_reroute_of_both_data_nodes_closes():
    diag = _diag()
    raw = flow_setting_scenario(5, 0)
    sc = parse_scenario(raw)
    data = sorted(n.id for n in sc.data_nodes)
    flows = run_gwtf(sc, seed=0).flows
    lp = optimal_routing(sc, seed=0).extra["lp_bound_total_cost"]
    total = sum(f.cost for f in flows)
    assert (total, lp) == (330.0, 317.0)
    assert [diag.reroute_gain(sc, flows, k) for k in data] == [0.0, 0.0]
    assert sum(f.cost - diag.cheapest(sc, f.path, data) for f in flows) == 0.0
    assert diag.exchange_gain(sc, flows, data) == 0.0
    gain, joint = diag.pair_gain(raw, flows, ("d0", "d1"), 0)
    assert gain == total - lp
    assert len(joint) == len(flows) and sum(f.cost for f in joint) == lp
    assert diag.pairs_in_turn(raw, flows, data, 0) == lp


def test_settings_other_than_5_and_6_are_refused_with_a_message(capsys):
    assert _diag().main(["--settings", "3"]) == 2
    assert "--settings takes 5 and/or 6" in capsys.readouterr().err
