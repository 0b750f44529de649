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
