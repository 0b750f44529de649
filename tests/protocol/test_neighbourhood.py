"""Bounded flow neighbourhoods (protocol/neighbourhood.py): which adjacent-stage relays a relay links to."""

from __future__ import annotations

import pytest

from gwtf_node.protocol.neighbourhood import (FLOW_NEIGHBOURS, SCALED_NEIGHBOURS, auto_choice, auto_flows, bound_links,
                                            nearest, refill, takes_newcomer, wide)
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.scenarios import FlowSetting, generate_layered, load_flow_setting


def test_nearest_keeps_the_k_cheapest_ties_by_id():
    costs = {"c": 3.0, "a": 1.0, "d": 1.0, "b": 2.0}
    assert nearest(costs, 2) == {"a": 1.0, "d": 1.0}
    assert nearest(costs, 3) == {"a": 1.0, "d": 1.0, "b": 2.0}
    assert nearest(costs, 4) == costs and nearest(costs, 10) == costs
    assert nearest(costs, 0) == costs  # 0: every one


def test_a_newcomer_is_taken_within_the_bound_or_when_cheaper_than_a_kept_link():
    kept = {"a": 1.0, "b": 5.0}
    assert takes_newcomer("n", 9.0, kept, 3)  # room left
    assert takes_newcomer("n", 4.0, kept, 2)  # cheaper than b: taken (b stays: no link is dropped for it)
    assert not takes_newcomer("n", 6.0, kept, 2)
    assert takes_newcomer("a", 6.0, kept, 1)  # already linked
    assert takes_newcomer("n", 99.0, kept, 0)


def test_refill_takes_the_cheapest_unlinked_up_to_the_bound():
    cands = {"a": 1.0, "b": 2.0, "c": 3.0, "x": 0.5}
    assert refill({"x"}, cands, 3) == {"a": 1.0, "b": 2.0}
    assert refill({"x", "a", "b"}, cands, 3) == {}
    assert refill({"x"}, cands, 0) == {"a": 1.0, "b": 2.0, "c": 3.0}


def test_bound_links_keeps_what_either_end_chose_and_every_data_node_link():
    sc = parse_scenario(generate_layered("t", FlowSetting(1, 60, 3, (1, 3), (1, 20)), 0))  # 20 relays a stage
    b = bound_links(sc, 4)
    assert {n.id for n in b.nodes} == {n.id for n in sc.nodes}
    data = [l for l in sc.links if sc.node(l.a).is_data or sc.node(l.b).is_data]
    assert all(b.cost(l.a, l.b) == l.cost for l in data)
    for r in sc.relays:
        for step in (1, -1):
            side = {p: l.cost for p, l in sc.neighbours(r.id).items()
                    if not sc.node(p).is_data and sc.node(p).stage == r.stage + step}
            linked = {p for p in side if b.cost(r.id, p) is not None}
            assert set(nearest(side, 4)) <= linked  # its own choice
            for p in linked - set(nearest(side, 4)):  # the others chose it
                back = {q: l.cost for q, l in sc.neighbours(p).items()
                        if not sc.node(q).is_data and sc.node(q).stage == r.stage}
                assert r.id in nearest(back, 4)
    assert len(b.links) < len(sc.links)
    assert bound_links(sc, 0) is sc and bound_links(sc, 20) is sc  # a stage within the bound is linked whole


def test_table_v_settings_are_within_a_bound_of_10_and_the_default_is_every_link():
    """Every Table V setting has at most 10 relays a stage: a bound of 10 changes none of them; the default bound
    (every link) changes no scenario."""
    for setting in range(1, 7):
        sc = load_flow_setting(setting, 0)
        assert bound_links(sc, 10) is sc, setting
    dense = parse_scenario(generate_layered("t", FlowSetting(1, 60, 3, (1, 3), (1, 20)), 0))
    assert FLOW_NEIGHBOURS == 0 and bound_links(dense, FLOW_NEIGHBOURS) is dense


def test_the_bound_keeps_the_optimum_of_a_dense_swarm():
    """320 relays x 16 stages (20 a stage, every relay linked to every relay of the next stage): the links a bound
    of 10 keeps carry the same maximum flow at the same cost."""
    sc = parse_scenario(generate_layered("t", FlowSetting(1, 320, 16, (1, 3), (1, 20)), 0))
    b = bound_links(sc, 10)
    assert len(b.links) < 0.6 * len(sc.links)
    full, kept = optimal_routing(sc), optimal_routing(b)
    assert kept.num_flows == full.num_flows
    assert kept.mean_cost <= full.mean_cost * 1.001


def test_auto_scales_one_data_node_from_ten_relays_a_stage_and_bounds_its_links():
    assert wide(1, 160, 16) and not wide(1, 159, 16) and not wide(2, 1000, 16) and not wide(0, 1000, 16)
    assert wide(1, 80, 16, half=True) and not wide(1, 79, 16, half=True)  # half the width: a relay's bound
    assert auto_flows(None, None, True) == (True, SCALED_NEIGHBOURS)
    assert auto_flows(None, None, False) == (False, FLOW_NEIGHBOURS)
    assert auto_flows(False, None, True) == (False, SCALED_NEIGHBOURS)  # the bound follows the width alone
    assert auto_flows(True, 0, False) == (True, 0)  # given: as given


def test_the_simulators_choose_what_a_daemon_that_knows_the_scenario_chooses():
    narrow = load_flow_setting(1, 0)  # 40 relays, 8 stages: a relay bounds (no stage is wider than 10)
    assert auto_choice(narrow) == ("waves", SCALED_NEIGHBOURS)
    assert auto_choice(load_flow_setting(2, 0)) == ("waves", FLOW_NEIGHBOURS)  # 40 relays, 10 stages
    width10 = parse_scenario(generate_layered("w", FlowSetting(1, 160, 16, (1, 3), (1, 20)), 0))
    assert auto_choice(width10) == ("scaling", SCALED_NEIGHBOURS)
    assert auto_choice(width10, "waves") == ("waves", SCALED_NEIGHBOURS)
    assert auto_choice(width10, "auto", 0) == ("scaling", 0)
    assert auto_choice(load_flow_setting(6, 0)) == ("waves", FLOW_NEIGHBOURS)  # several data nodes
    with pytest.raises(ValueError, match="formation is one of"):
        auto_choice(narrow, "label")
