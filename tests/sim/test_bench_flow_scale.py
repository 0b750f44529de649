"""`scripts/bench_flow_scale.py --bound`: successive shortest paths computed centrally reach the optimum (networkx
min-cost max-flow), and the flow machines' label waves are never fewer than the distinct augmentation costs (the
waves of a primal-dual scheme, which docs/bench_flow.md quotes as the floor of the wave count)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import load_flow_setting

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_flow_scale", ROOT / "scripts" / "bench_flow_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("setting, seed", [(1, 0), (3, 0), (3, 1)])
def test_ssp_bound_is_the_optimum_and_a_floor_of_the_waves(setting, seed):
    sc = load_flow_setting(setting, seed)
    bound = _bench().ssp_waves(sc)
    opt = optimal_routing(sc)
    assert bound["ssp_units"] == opt.num_flows
    assert bound["ssp_total_cost"] == pytest.approx(opt.mean_cost * opt.num_flows)
    assert 1 <= bound["pd_waves"] <= bound["ssp_units"]
    assert 0 < bound["tight_in_per_node_pd"] <= bound["changed_in_per_node_pd"] <= bound["changed_in_per_node"]
    assert bound["changed_in_per_node"] <= bound["ssp_units"] * bound["links_per_node"] + 1e-9
    run = run_gwtf(sc, seed=seed)
    assert run.num_flows == opt.num_flows
    assert run.extra["waves"] >= bound["pd_waves"]


def test_setting3_seed0_has_fewer_primal_dual_waves_than_augmentations():
    bound = _bench().ssp_waves(load_flow_setting(3, 0))
    assert (bound["ssp_units"], bound["pd_waves"]) == (47, 22)


def test_skewed_links_count_the_links_whose_reduced_cost_rises():
    """A limit told against the floors of the previous wave (reduced costs) holds on a link whose two ends rose
    alike; `_skew` counts the others (the receiver's threshold rose more than the sender's label), by > 0 and by
    more than the slack."""
    b = _bench()
    prevs = {"r": [(("o", "p"), 1.0), (("o", "q"), 1.0), (("o", "u"), 1.0)]}
    skew = [0, 0]
    # r's IN label rises by 1; p's OUT label by 1 (uniform), q's by 2, u's by 5 (more than 1 + the slack 2)
    b._skew(skew, prevs, {"r": 10.0}, {"r": 11.0}, {("o", "p"): 11.0, ("o", "q"): 11.0, ("o", "u"): 11.0},
            {("o", "p"): 12.0, ("o", "q"): 13.0, ("o", "u"): 16.0})
    assert skew == [2, 1]
    # an unreachable end counts nothing
    b._skew(skew, prevs, {"r": 10.0}, {"r": float("inf")}, {("o", "u"): 11.0}, {("o", "u"): 16.0})
    assert skew == [2, 1]
    bound = b.ssp_waves(load_flow_setting(3, 0))
    assert 0 <= bound["skewed_links_per_node_pd_slack"] <= bound["skewed_links_per_node_pd"] \
        <= bound["pd_waves"] * bound["links_per_node"]
