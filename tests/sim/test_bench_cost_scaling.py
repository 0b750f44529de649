"""`scripts/bench_cost_scaling.py`: cost scaling reaches the min-cost maximum flow (networkx) on the instances whose
messages docs/bench_flow.md quotes, with lazy and with eager prices, and its message counts add up."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gwtf_node.protocol.neighbourhood import bound_links
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.scenarios import FlowSetting, generate_layered, load_flow_setting

from support.helpers import load_script


def _bench():
    return load_script("bench_cost_scaling")


def _layered(relays: int, stages: int, seed: int, k: int = 0):
    sc = parse_scenario(generate_layered(f"t-{relays}x{stages}", FlowSetting(1, relays, stages, (1, 3), (1, 20)), seed))
    return bound_links(sc, k)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("factor, first_eps", [(2, None), (5, None), (2, 3)])
@pytest.mark.parametrize("relays, stages, seed, k", [(24, 4, 0, 0), (40, 5, 1, 3), (64, 8, 2, 4)])
def test_cost_scaling_is_the_min_cost_maximum_flow(relays, stages, seed, k, factor, first_eps, eager):
    sc = _layered(relays, stages, seed, k)
    got = _bench().cost_scaling(sc, factor, eager, first_eps)
    opt = optimal_routing(sc)
    assert got["units"] == opt.num_flows > 0
    assert got["certified"]  # 1/(sides + 1)-optimal prices: the flows are optimal by them alone
    assert got["total_cost"] == pytest.approx(opt.mean_cost * opt.num_flows)
    machines = len(sc.nodes)
    assert got["messages"] >= 2 * machines * got["phases"]  # every phase starts and ends at every machine
    if eager:
        assert got["refused_per_node"] == 0  # prices are always known: no push is refused
    else:
        assert got["refused_per_node"] <= got["pushes_per_node"]


@pytest.mark.parametrize("setting", [1, 3])
def test_cost_scaling_on_table_v_settings(setting):
    sc = load_flow_setting(setting, 0)
    got = _bench().cost_scaling(sc)
    opt = optimal_routing(sc)
    assert (got["units"], got["total_cost"]) == (opt.num_flows, pytest.approx(opt.mean_cost * opt.num_flows))


def test_lazy_prices_send_fewer_messages_than_eager_ones():
    sc = _layered(160, 16, 0, 10)
    lazy, eager = _bench().cost_scaling(sc), _bench().cost_scaling(sc, eager=True)
    assert lazy["total_cost"] == eager["total_cost"]
    assert lazy["per_node"] < eager["per_node"]
    assert lazy["refused_per_node"] > 0  # stale prices are met, and each refusal is counted


def test_non_integer_costs_are_refused_with_a_message():
    sc = load_flow_setting(1, 0)
    link = sc.links[0]
    odd = type(sc)(sc.name, sc.stages, sc.nodes, (replace(link, cost=link.cost + 0.5),) + sc.links[1:],
                   sc.activation_mb)
    with pytest.raises(SystemExit, match="integer link costs"):
        _bench().cost_scaling(odd)


@pytest.mark.parametrize("relays, stages, seed, k, factor, first_eps", [
    (24, 4, 0, 0, 2, None), (40, 5, 1, 3, 2, None), (64, 8, 2, 4, 5, None), (40, 5, 1, 3, 2, 1),
    # a push refused after its tail relabelled past the arc it saturated: sent again, or the certificate fails
    (96, 8, 3, 4, 2, 4)])
def test_machines_in_the_simulator_reach_the_min_cost_maximum_flow(relays, stages, seed, k, factor, first_eps):
    sc = _layered(relays, stages, seed, k)
    got = _bench().distributed(sc, factor, first_eps)
    opt = optimal_routing(sc)
    assert got["units"] == opt.num_flows > 0
    assert got["total_cost"] == pytest.approx(opt.mean_cost * opt.num_flows)
    assert got["certified"]
    assert got["formed_s"] is not None and got["formed_s"] > 0
    by_type = got["by_type"]
    assert by_type["Phase"] == got["phases"] * (len(sc.nodes) - 1)  # the data node tells each phase to every node
    assert by_type["Done"] == len(sc.nodes) - 1
    assert sum(by_type.values()) == got["messages"]
    phases = got["per_phase"]
    assert len(phases) == got["phases"] and phases[-1]["eps"] < 1 / len(sc.nodes)  # exact: below 1 / sides
    assert sum(p["s"] for p in phases) == pytest.approx(got["formed_s"], abs=0.1 * len(phases))
    assert sum(sum(p["received"].values()) for p in phases) <= got["messages"]  # not those before a first phase


@pytest.mark.parametrize("setting", [1, 2, 3, 4])
def test_machines_in_the_simulator_on_table_v_settings(setting):
    sc = load_flow_setting(setting, 1)
    got = _bench().distributed(sc)
    opt = optimal_routing(sc)
    assert (got["units"], got["total_cost"]) == (opt.num_flows, pytest.approx(opt.mean_cost * opt.num_flows))
    assert got["certified"]


def test_eager_prices_in_the_simulator_trade_messages_for_refusals():
    sc = _layered(64, 8, 2, 4)
    lazy, eager = _bench().distributed(sc), _bench().distributed(sc, eager_phases=10 ** 6)
    assert eager["certified"] and (eager["units"], eager["total_cost"]) == (lazy["units"], lazy["total_cost"])
    assert "Price" not in lazy["by_type"] and eager["by_type"]["Price"] > 0
    assert eager["by_type"].get("Refuse", 0) < lazy["by_type"]["Refuse"]
    first = _bench().distributed(sc, eager_phases=1)
    assert first["certified"] and 0 < first["by_type"]["Price"] < eager["by_type"]["Price"]
