"""Homing (protocol/flow/homing.py): units formed as one commodity sent back to the data node they left."""

from __future__ import annotations

import collections
import random

from gwtf_node.protocol.flow.homing import Loads, exchange, home_units, place_away, spread, swap_suffixes, unit_cost


def table(costs: dict[tuple[str, str], float]):
    return lambda a, b: costs.get((a, b))


def per_stage(units) -> list[collections.Counter]:
    return [collections.Counter(u[1][k] for u in units) for k in range(len(units[0][1]))]


def test_a_crossed_pair_swaps_its_suffixes_where_that_costs_least():
    # A's unit ends at B, B's ends at A: swapping after stage 1 (x1/y1 -> y2/x2) costs 2, the last hops 20
    c = {("A", "x1"): 1, ("x1", "x2"): 1, ("x2", "B"): 1, ("B", "y1"): 1, ("y1", "y2"): 1, ("y2", "A"): 1,
         ("x1", "y2"): 2, ("y1", "x2"): 2, ("x2", "A"): 10, ("y2", "B"): 10}
    units = [("A", ("x1", "x2"), "B"), ("B", ("y1", "y2"), "A")]
    assert swap_suffixes(units, table(c)) == 1
    assert sorted(units) == [("A", ("x1", "y2"), "A"), ("B", ("y1", "x2"), "B")]


def test_a_swap_over_a_missing_link_is_not_taken():
    c = {("A", "x1"): 1, ("x1", "x2"): 1, ("x2", "B"): 1, ("B", "y1"): 1, ("y1", "y2"): 1, ("y2", "A"): 1,
         ("x2", "A"): 5, ("y2", "B"): 5}  # x1 - y2 and y1 - x2 are not linked: only the last hops can swap
    units = [("A", ("x1", "x2"), "B"), ("B", ("y1", "y2"), "A")]
    swap_suffixes(units, table(c))
    assert sorted(units) == [("A", ("x1", "x2"), "A"), ("B", ("y1", "y2"), "B")]


def test_a_unit_away_without_a_partner_goes_to_the_cheapest_data_node_with_room():
    c = {("A", "x"): 1, ("x", "A"): 1, ("B", "x"): 2, ("x", "B"): 2, ("C", "x"): 9, ("x", "C"): 9}
    units = [("A", ("x",), "A"), ("C", ("x",), "B"), ("C", ("x",), "B")]
    assert place_away(units, table(c), {"A": 1, "B": 1, "C": 5}) == 2
    assert sorted(units) == [("A", ("x",), "A"), ("B", ("x",), "B"), ("C", ("x",), "C")]  # A full: B, then C


def test_an_exchange_lowers_the_cost_and_keeps_each_relay_its_units():
    # two units that would each be cheaper with the other's second half
    c = {("A", "a1"): 1, ("a1", "a2"): 9, ("a1", "b2"): 1, ("a2", "A"): 1, ("b2", "A"): 1,
         ("B", "b1"): 1, ("b1", "b2"): 9, ("b1", "a2"): 1, ("b2", "B"): 1, ("a2", "B"): 1}
    units = [("A", ("a1", "a2"), "A"), ("B", ("b1", "b2"), "B")]
    before = sum(unit_cost(table(c), u) for u in units)
    assert exchange(units, table(c), {"A": 1, "B": 1}) == 1
    assert sum(unit_cost(table(c), u) for u in units) == before - 16
    assert all(u[0] == u[2] for u in units)


def test_random_instances_keep_capacities_and_demand_and_end_home():
    rng = random.Random(7)
    for _ in range(30):
        stages, data = rng.randint(1, 4), ["A", "B", "C"]
        relays = [[f"r{k}.{i}" for i in range(3)] for k in range(stages)]
        c = {}
        for k in range(stages):
            for r in relays[k]:
                for d in data:
                    if k == 0:
                        c[(d, r)] = rng.randint(1, 9)
                    if k == stages - 1:
                        c[(r, d)] = rng.randint(1, 9)
                for s in relays[k + 1] if k + 1 < stages else ():
                    if rng.random() < 0.8:
                        c[(r, s)] = rng.randint(1, 9)
        units = []
        while len(units) < 6:
            path = [rng.choice(relays[0])]
            for k in range(1, stages):
                linked = [s for s in relays[k] if (path[-1], s) in c]
                if not linked:
                    break
                path.append(rng.choice(linked))
            if len(path) == stages:
                units.append((rng.choice(data), tuple(path), rng.choice(data)))
        demand = {"A": 3, "B": 2, "C": 4}
        homed, steps = home_units(units, table(c), demand)
        assert all(u[0] == u[2] for u in homed)
        assert all(sum(u[0] == d for u in homed) <= demand[d] for d in data)
        assert all(unit_cost(table(c), u) < float("inf") for u in homed)
        if len(homed) == len(units):  # no unit dropped: every relay keeps as many units at each stage
            assert per_stage(homed) == per_stage(units)
        assert steps["swaps"] + steps["placed_away"] >= sum(u[0] != u[2] for u in units) // 2
        raw = [(u[0], u[1], u[0]) for u in units if unit_cost(table(c), (u[0], u[1], u[0])) < float("inf")]
        if raw:  # step 4 alone, from units as they left: the slowest gets no slower, every relay keeps its units
            kept, before = list(raw), max(Loads(list(raw), table(c)).load)
            spread(raw, table(c))
            assert max(Loads(raw, table(c)).load) <= before and per_stage(raw) == per_stage(kept)
            assert sum(unit_cost(table(c), u) for u in raw) <= sum(unit_cost(table(c), u) for u in kept) + 1e-9
            assert sorted(u[0] for u in raw) == sorted(u[0] for u in kept) and all(u[0] == u[2] for u in raw)


def test_units_that_share_a_slow_link_are_spread_where_the_cost_is_the_same():
    # A's two units both cross x1 -> x2 (10) and wait for each other there; swapping one's last stage with B's
    # unit costs as much (no exchange gains) and leaves no slow link shared
    c = {("A", "x1"): 1, ("x1", "x2"): 10, ("x2", "A"): 1, ("B", "y1"): 1, ("y1", "y2"): 1, ("y2", "B"): 1,
         ("x1", "y2"): 10, ("y2", "A"): 1, ("y1", "x2"): 1, ("x2", "B"): 1}
    units = [("A", ("x1", "x2"), "A"), ("A", ("x1", "x2"), "A"), ("B", ("y1", "y2"), "B")]
    assert max(Loads(list(units), table(c)).load) == 24
    homed, steps = home_units(units, table(c), {"A": 2, "B": 1})
    assert steps["exchanges"] == 0 and steps["spread"] == 1
    assert sorted(homed) == [("A", ("x1", "x2"), "A"), ("A", ("x1", "y2"), "A"), ("B", ("y1", "x2"), "B")]
    assert max(Loads(homed, table(c)).load) == 13
    assert sum(unit_cost(table(c), u) for u in homed) == sum(unit_cost(table(c), u) for u in units)


def test_spreading_stops_where_no_swap_makes_the_slowest_unit_faster_at_no_higher_cost():
    dearer = {("A", "x1"): 1, ("x1", "x2"): 10, ("x2", "A"): 1, ("B", "y1"): 1, ("y1", "y2"): 1, ("y2", "B"): 1,
              ("x1", "y2"): 12, ("y2", "A"): 1, ("y1", "x2"): 1, ("x2", "B"): 1}
    units = [("A", ("x1", "x2"), "A"), ("A", ("x1", "x2"), "A"), ("B", ("y1", "y2"), "B")]
    assert spread(units, table(dearer)) == 0  # the swap above, at 2 more: not made
    c = {("A", "x1"): 1, ("x1", "x2"): 10, ("x2", "A"): 1, ("B", "y1"): 1, ("y1", "y2"): 1, ("y2", "B"): 1}
    units = [("A", ("x1", "x2"), "A"), ("B", ("y1", "y2"), "B")]  # no link across: nothing to swap
    assert spread(units, table(c)) == 0 and units == [("A", ("x1", "x2"), "A"), ("B", ("y1", "y2"), "B")]
    assert spread([], table(c)) == 0


def test_spreading_prices_swaps_around_a_unit_over_an_unknown_link():
    # x2 -> A is unknown (INF): the slowest unit is then one on it, and a swap that takes it off x2 -> A changes
    # that link's count, which another unit (z) shares; its load stays INF, and the step does not fail
    c = {("A", "x1"): 1, ("x1", "x2"): 1, ("A", "z1"): 1, ("z1", "x2"): 1, ("B", "y1"): 1, ("y1", "y2"): 1,
         ("y2", "B"): 1, ("x1", "y2"): 1, ("y1", "x2"): 1, ("x2", "B"): 1, ("y2", "A"): 1, ("A", "y1"): 1,
         ("B", "x1"): 1}
    units = [("A", ("x1", "x2"), "A"), ("B", ("y1", "y2"), "B"), ("A", ("z1", "x2"), "A")]
    kept = list(units)
    spread(units, table(c))
    assert per_stage(units) == per_stage(kept) and all(u[0] == u[2] for u in units)
    assert sorted(u[0] for u in units) == sorted(u[0] for u in kept)
