"""The reference routings (optimal, SWARM) and the routing checker."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim import baselines
from gwtf_node.sim.baselines import max_flow_value, optimal_routing, swarm_routing
from gwtf_node.sim.result import Flow, RoutingResult, path_cost
from gwtf_node.sim.scenarios import load_flow_setting
from gwtf_node.sim.validate import check_routing

DECCOM = Path(__file__).resolve().parents[1] / "data" / "deccom-flow-tests"  # copied from ../shared/data


def deccom(name: str):
    return parse_scenario(json.loads((DECCOM / f"{name}.json").read_text()))


def scenario(stages, nodes, links, name="hand"):
    """nodes: (id, stage or None for data, capacity); links: (a, b, cost)."""
    return parse_scenario({
        "name": name, "stages": stages,
        "nodes": [{"id": i, "role": "data", "capacity": c} if s is None
                  else {"id": i, "role": "relay", "stage": s, "capacity": c} for i, s, c in nodes],
        "links": [{"a": a, "b": b, "cost": c} for a, b, c in links],
    })


def routes(result):
    return sorted((f.data_node, f.path) for f in result.flows)


# ------------------------------------------------------------ authors' tests


@pytest.mark.parametrize("name, flows, cost", [("test2", 18, 16863), ("test3", 11, 376)])
def test_optimum_on_the_authors_single_source_tests(name, flows, cost):
    sc = deccom(name)
    opt = optimal_routing(sc)
    check_routing(sc, opt)
    assert (opt.num_flows, opt.total_cost) == (flows, cost)
    assert max_flow_value(sc) == flows
    assert opt.policy == "optimal" and opt.scenario == sc.name


def test_optimum_on_the_authors_two_source_test():
    sc = deccom("test1")
    opt = optimal_routing(sc)
    check_routing(sc, opt)
    assert opt.extra["lp_max_flow"] == pytest.approx(13)
    assert opt.extra["lp_bound_total_cost"] == pytest.approx(10588, abs=1e-6)
    assert opt.extra["lp_bound_mean_cost"] == pytest.approx(10588 / 13)
    # The LP happens to be integral here, so the routing attains the bound.
    assert opt.num_flows == 13
    assert opt.total_cost == pytest.approx(10588)
    assert max_flow_value(sc) == 13


@pytest.mark.parametrize("name", ["test1", "test2", "test3"])
def test_swarm_on_the_authors_tests_is_legal_and_no_better(name):
    sc = deccom(name)
    sw = swarm_routing(sc)
    check_routing(sc, sw)
    opt = optimal_routing(sc, flow_value=sw.num_flows)
    assert opt.num_flows == sw.num_flows
    assert sw.total_cost >= opt.total_cost - 1e-9


# --------------------------------------------------------- Table V settings


@pytest.mark.parametrize("setting, seed", list(itertools.product([1, 2, 3, 4], range(5))))
def test_swarm_never_beats_the_optimum_single_source(setting, seed):
    sc = load_flow_setting(setting, seed)
    opt, sw = optimal_routing(sc, seed), swarm_routing(sc, seed)
    check_routing(sc, opt)
    check_routing(sc, sw)
    assert opt.num_flows == max_flow_value(sc)
    assert sw.num_flows <= opt.num_flows
    if sw.num_flows == opt.num_flows:
        assert sw.mean_cost >= opt.mean_cost - 1e-9
    same = optimal_routing(sc, seed, flow_value=sw.num_flows)
    check_routing(sc, same)
    assert same.num_flows == sw.num_flows
    assert sw.total_cost >= same.total_cost - 1e-9


@pytest.mark.parametrize("setting, seed", list(itertools.product([5, 6], range(3))))
def test_multi_source_settings(setting, seed):
    sc = load_flow_setting(setting, seed)
    opt, sw = optimal_routing(sc, seed), swarm_routing(sc, seed)
    check_routing(sc, opt)
    check_routing(sc, sw)
    ex = opt.extra
    assert opt.num_flows <= ex["lp_max_flow"] + 1e-9 <= ex["single_commodity_max_flow"] + 2e-9
    assert ex["single_commodity_max_flow"] == max_flow_value(sc)
    assert ex["integral_method"] in ("lp", "milp")
    assert opt.num_flows == pytest.approx(ex["lp_max_flow"])  # these instances have no integrality gap in flow
    assert opt.total_cost >= ex["lp_bound_total_cost"] - 1e-6
    assert sw.num_flows <= opt.num_flows
    same = optimal_routing(sc, seed, flow_value=sw.num_flows)
    assert same.num_flows == sw.num_flows
    assert sw.total_cost >= same.total_cost - 1e-9


def test_optimal_is_valid_and_deterministic_on_setting_6():
    for seed in range(10):
        sc = load_flow_setting(6, seed)
        opt = optimal_routing(sc, seed)
        check_routing(sc, opt)
        if seed < 2:
            assert routes(optimal_routing(sc, seed)) == routes(opt)


def test_swarm_is_deterministic():
    sc = load_flow_setting(6, 3)
    a, b = swarm_routing(sc, 0), swarm_routing(sc, 7)
    assert routes(a) == routes(b) and b.seed == 7 and a.policy == "swarm"


# ------------------------------------------------------ hand-made instances


def test_greedy_cheap_first_hop_leads_to_an_expensive_second():
    # d -> a is the cheapest first hop, but a -> c costs 10; via b the route costs 4.
    sc = scenario(2, [("d", None, 5), ("a", 0, 1), ("b", 0, 1), ("c", 1, 1)],
                  [("d", "a", 1), ("d", "b", 2), ("a", "c", 10), ("b", "c", 1), ("c", "d", 1)])
    sw, opt = swarm_routing(sc), optimal_routing(sc)
    check_routing(sc, sw)
    check_routing(sc, opt)
    assert routes(sw) == [("d", ("a", "c"))] and sw.total_cost == 12
    assert routes(opt) == [("d", ("b", "c"))] and opt.total_cost == 4
    assert max_flow_value(sc) == 1
    # Then d -> b finds c full, three times in a row: dropped, and d gives up.
    assert sw.extra["dropped"] == 3 and sw.rounds == 4 and sw.messages == 3 + 3


def test_greedy_blocks_a_relay_that_another_route_needed():
    # The first microbatch takes c; b has no other way on, so SWARM routes 1 flow where 2 fit.
    sc = scenario(2, [("d", None, 5), ("a", 0, 1), ("b", 0, 1), ("c", 1, 1), ("e", 1, 1)],
                  [("d", "a", 1), ("d", "b", 1), ("a", "c", 1), ("a", "e", 10), ("b", "c", 1),
                   ("c", "d", 1), ("e", "d", 1)])
    sw, opt = swarm_routing(sc), optimal_routing(sc)
    check_routing(sc, sw)
    check_routing(sc, opt)
    assert routes(sw) == [("d", ("a", "c"))] and sw.total_cost == 3
    assert routes(opt) == [("d", ("a", "e")), ("d", ("b", "c"))] and opt.total_cost == 15
    assert max_flow_value(sc) == 2
    one = optimal_routing(sc, flow_value=1)
    assert one.num_flows == 1 and one.total_cost == 3


def test_round_robin_greedy_with_two_data_nodes():
    # One stage: a route is d -> r -> d over the same link, so it costs twice the link.
    sc = scenario(1, [("d0", None, 1), ("d1", None, 1), ("a", 0, 1), ("b", 0, 1)],
                  [("d0", "a", 1), ("d0", "b", 2), ("d1", "a", 1), ("d1", "b", 100)])
    sw, opt = swarm_routing(sc), optimal_routing(sc)
    check_routing(sc, sw)
    check_routing(sc, opt)
    assert routes(sw) == [("d0", ("a",)), ("d1", ("b",))] and sw.total_cost == 202
    assert routes(opt) == [("d0", ("b",)), ("d1", ("a",))] and opt.total_cost == 6
    assert opt.extra["lp_bound_total_cost"] == pytest.approx(6)
    assert opt.extra["lp_max_flow"] == pytest.approx(2)


def test_single_commodity_bound_is_only_an_upper_bound():
    # d0 reaches the last stage but only d1 links back from it: no legal route at all.
    sc = scenario(2, [("d0", None, 3), ("d1", None, 3), ("a", 0, 2), ("b", 1, 2)],
                  [("d0", "a", 1), ("a", "b", 1), ("b", "d1", 1)])
    assert max_flow_value(sc) == 2
    opt, sw = optimal_routing(sc), swarm_routing(sc)
    assert opt.num_flows == 0 and opt.extra["lp_max_flow"] == 0
    assert sw.num_flows == 0 and sw.extra["dropped"] == 2 * baselines.SWARM_MAX_FAILURES


def test_links_that_skip_stages_are_ignored():
    # d - b skips stage 0, a - c skips stage 1, a - e joins one stage: none of them may be used.
    sc = scenario(3, [("d", None, 5), ("a", 0, 2), ("e", 0, 2), ("b", 1, 2), ("c", 2, 2)],
                  [("d", "a", 5), ("a", "b", 5), ("b", "c", 5), ("c", "d", 5),
                   ("d", "b", 1), ("a", "c", 1), ("a", "e", 1)])
    opt, sw = optimal_routing(sc), swarm_routing(sc)
    check_routing(sc, opt)
    check_routing(sc, sw)
    assert routes(opt) == routes(sw) == [("d", ("a", "b", "c"))] * 2
    assert opt.total_cost == sw.total_cost == 40
    assert max_flow_value(sc) == 2


def test_greedy_walks_into_a_dead_end():
    # e is the cheapest first hop but links to nothing further; SWARM never looks ahead.
    sc = scenario(2, [("d", None, 5), ("a", 0, 1), ("e", 0, 1), ("b", 1, 1)],
                  [("d", "a", 5), ("d", "e", 1), ("a", "b", 5), ("b", "d", 5)])
    sw, opt = swarm_routing(sc), optimal_routing(sc)
    assert sw.num_flows == 0 and sw.extra["dropped"] == baselines.SWARM_MAX_FAILURES
    assert routes(opt) == [("d", ("a", "b"))] and opt.total_cost == 15


def test_rounding_fallback_still_gives_a_legal_routing(monkeypatch):
    monkeypatch.setattr(baselines, "_milp", lambda *a, **k: None)
    for seed in (4, 8, 9):  # setting-6 seeds whose LP optimum is fractional
        sc = load_flow_setting(6, seed)
        opt = optimal_routing(sc)
        check_routing(sc, opt)
        assert opt.extra["integral_method"] == "rounding"
        assert 0 < opt.num_flows <= opt.extra["lp_max_flow"]


# ------------------------------------------ random tiny instances vs brute force


def brute_force(sc):
    """(most flows, least total cost) over every multiset of legal routes."""
    by_stage = [sorted(r.id for r in sc.relays_of_stage(s)) for s in range(sc.stages)]
    paths = []
    for d in sorted(n.id for n in sc.data_nodes):
        for p in itertools.product(*by_stage):
            try:
                paths.append((d, p, path_cost(sc, d, p)))
            except ValueError:
                pass
    best = (0, 0.0)

    def go(i, load, count, cost):
        nonlocal best
        if (-count, cost) < (-best[0], best[1]):
            best = (count, cost)
        if i == len(paths):
            return
        d, p, c = paths[i]
        k = 0
        while True:
            go(i + 1, dict(load), count + k, cost + k * c)
            k += 1
            for node in (d, *p):
                load[node] = load.get(node, 0) + 1
            if any(load[node] > sc.node(node).capacity for node in (d, *p)):
                return

    go(0, {}, 0, 0.0)
    return best


@st.composite
def tiny_scenarios(draw):
    n_data = draw(st.integers(1, 2))
    stages = draw(st.integers(1, 4 - n_data))  # keeps the brute force to a few thousand cases
    data = [(f"d{k}", None, draw(st.integers(0, 3))) for k in range(n_data)]
    relays = [(f"r{s}_{k}", s, draw(st.integers(0, 2)))
              for s in range(stages) for k in range(draw(st.integers(1, 2)))]
    pairs = [(d[0], r[0]) for d in data for r in relays if r[1] in (0, stages - 1)]
    pairs += [(a[0], b[0]) for a in relays for b in relays if b[1] == a[1] + 1]
    links = [(a, b, draw(st.integers(0, 20))) for a, b in pairs if draw(st.integers(0, 4)) > 0]
    return scenario(stages, data + relays, links, name="tiny")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_scenarios())
def test_optimal_matches_brute_force_and_swarm_is_no_better(sc):
    opt, sw = optimal_routing(sc), swarm_routing(sc)
    check_routing(sc, opt)
    check_routing(sc, sw)
    assert (opt.num_flows, opt.total_cost) == pytest.approx(brute_force(sc))
    assert opt.num_flows <= max_flow_value(sc)
    if len(sc.data_nodes) == 1:
        assert opt.num_flows == max_flow_value(sc)
    assert sw.num_flows <= opt.num_flows
    same = optimal_routing(sc, flow_value=sw.num_flows)
    assert same.num_flows == sw.num_flows
    assert sw.total_cost >= same.total_cost - 1e-9


# ------------------------------------------------------------ check_routing


def test_check_routing_rejects_illegal_routings():
    sc = scenario(2, [("d", None, 1), ("e", None, 1), ("a", 0, 1), ("b", 1, 1), ("c", 1, 1)],
                  [("d", "a", 1), ("a", "b", 1), ("b", "d", 1), ("e", "a", 1), ("b", "e", 1)])
    good = Flow("d", ("a", "b"), 3.0)
    check_routing(sc, [good])
    check_routing(sc, RoutingResult("hand", "x", 0, [good]))
    bad = {
        "capacity": [good, Flow("e", ("a", "b"), 3.0)],
        "data node": [good, good],
        "stages": [Flow("d", ("a",), 2.0)],
        "not a relay of stage": [Flow("d", ("b", "a"), 3.0)],
        "no link": [Flow("d", ("a", "c"), 3.0)],
        "reported cost": [Flow("d", ("a", "b"), 4.0)],
        "not a data node": [Flow("a", ("a", "b"), 3.0)],
    }
    for words, flows in bad.items():
        with pytest.raises(AssertionError, match=words):
            check_routing(sc, flows)
