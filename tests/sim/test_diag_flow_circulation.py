"""`scripts/diag_flow_circulation.py`: the balanced circulation carries the maximum flow at no more than the
multi-commodity LP bound (a relaxation: a unit may end at another data node), suffix swaps make every unit end
where it left without moving a unit off a relay, and exchanges never raise the cost."""

from __future__ import annotations

from collections import Counter

import pytest

from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import max_flow_value, optimal_routing
from gwtf_node.sim.scenarios import flow_setting_scenario

from support.helpers import load_script


def _diag():
    return load_script("diag_flow_circulation")


def test_a_suffix_swap_sends_each_unit_home_with_its_partners_last_hop():
    diag = _diag()
    costs = {("d0", "x0"): 1, ("d0", "y0"): 9, ("d1", "x0"): 9, ("d1", "y0"): 1, ("x0", "x1"): 1, ("x0", "y1"): 2,
             ("y0", "y1"): 1, ("y0", "x1"): 3, ("x1", "d0"): 9, ("x1", "d1"): 1, ("y1", "d0"): 1, ("y1", "d1"): 9}
    nodes = [{"id": d, "role": "data", "capacity": 2} for d in ("d0", "d1")]
    nodes += [{"id": r, "role": "relay", "stage": int(r[1]), "capacity": 1} for r in ("x0", "y0", "x1", "y1")]
    sc = parse_scenario({"name": "swap", "stages": 2, "nodes": nodes,
                         "links": [{"a": a, "b": b, "cost": c} for (a, b), c in costs.items()]})
    units = [["d0", ["x0", "x1"], "d1"], ["d1", ["y0", "y1"], "d0"]]  # each ends at the other data node
    assert [diag.unit_cost(sc, u) for u in units] == [3, 3]
    diag.swap_suffixes(sc, units)
    assert sorted(map(str, units)) == sorted(map(str, [["d0", ["x0", "y1"], "d0"], ["d1", ["y0", "x1"], "d1"]]))
    assert sum(diag.unit_cost(sc, u) for u in units) == (1 + 2 + 1) + (1 + 3 + 1)
    assert diag.exchange(sc, units, ["d0", "d1"]) == 0  # swapping back would end away from home


@pytest.mark.parametrize("setting, seed", [(5, 0), (6, 0)])
def test_circulation_then_swaps_then_exchanges_on_a_flow_setting(setting, seed):
    diag = _diag()
    sc = parse_scenario(flow_setting_scenario(setting, seed))
    data = sorted(n.id for n in sc.data_nodes)
    lp = optimal_routing(sc, seed=seed).extra["lp_bound_total_cost"]
    units = diag.circulation(sc)
    assert len(units) == max_flow_value(sc)
    used = Counter(r for u in units for r in u[1])
    assert all(used[n.id] <= n.capacity for n in sc.nodes if not n.is_data)
    assert Counter(u[0] for u in units) == Counter(u[2] for u in units)  # balanced
    relaxed = sum(diag.unit_cost(sc, u) for u in units)
    assert relaxed <= lp + 1e-6
    diag.swap_suffixes(sc, units)
    assert all(u[0] == u[2] for u in units)
    assert Counter(r for u in units for r in u[1]) == used
    swapped = sum(diag.unit_cost(sc, u) for u in units)
    assert swapped >= lp - 1e-6  # an integral multi-commodity routing
    diag.exchange(sc, units, data)
    assert all(u[0] == u[2] for u in units) and Counter(r for u in units for r in u[1]) == used
    assert lp - 1e-6 <= sum(diag.unit_cost(sc, u) for u in units) <= swapped


@pytest.mark.parametrize("setting, seed", [(5, 0), (6, 0)])
def test_handoff_routes_the_maximum_flow_within_capacity_and_sends_on_what_came_home_elsewhere(setting, seed):
    """`handoff`: as many units as the maximum flow, every relay within its capacity, each unit a path from a
    data node through every stage to a data node; it costs no less than the balanced circulation (an optimum of
    a relaxation of what it computes)."""
    diag = _diag()
    sc = parse_scenario(flow_setting_scenario(setting, seed))
    units = diag.handoff(sc)
    assert len(units) == max_flow_value(sc)
    used = Counter(r for u in units for r in u[1])
    assert all(used[n.id] <= n.capacity for n in sc.nodes if not n.is_data)
    assert all([sc.node(r).stage for r in u[1]] == list(range(sc.stages)) for u in units)
    best = sum(diag.unit_cost(sc, u) for u in diag.circulation(sc))
    away = Counter(u[0] for u in units) - Counter(u[2] for u in units)
    assert sum(diag.unit_cost(sc, u) for u in units) >= best - 1e-6 or sum(away.values()) > 0


def test_settings_without_several_data_nodes_are_refused(capsys):
    assert _diag().main(["--settings", "3"]) == 2
    assert "--settings takes 5 and/or 6" in capsys.readouterr().err
