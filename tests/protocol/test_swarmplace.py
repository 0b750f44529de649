"""The whole-swarm placement (protocol/swarmplace.py) and the leader's use of it for a swarm forming from scratch."""

from __future__ import annotations

import math
import random

import pytest

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.membership import INITIAL, MembershipConfig, MembershipMachine
from gwtf_node.protocol.messages import Assignment, JoinRequest
from gwtf_node.protocol.placement import Candidate, told_links
from gwtf_node.protocol.swarmplace import (
    SwarmProblem, _chains, _quotas, place_new_swarm, place_swarm,
)


def two_sites(near: float = 1.0, far: float = 100.0) -> SwarmProblem:
    """Data node dA and relays a1, a2 at site A; dB, b1, b2 at site B; two stages, capacity and demand 1."""
    nodes = ["dA", "a1", "a2", "dB", "b1", "b2"]
    links = {}
    for i, x in enumerate(nodes):
        for y in nodes[i + 1:]:
            links[(x, y) if x < y else (y, x)] = near if _site(x) == _site(y) else far
    return SwarmProblem(2, {"a1": 1, "a2": 1, "b1": 1, "b2": 1}, {"dA": 1, "dB": 1}, links)


def _site(n: str) -> str:
    return n[1] if n.startswith("d") else n[0].upper()


def test_each_data_node_gets_a_chain_at_its_own_site() -> None:
    p = two_sites()
    stages = place_swarm(p)
    assert sorted(stages) == ["a1", "a2", "b1", "b2"]
    assert {stages["a1"], stages["a2"]} == {0, 1} and {stages["b1"], stages["b2"]} == {0, 1}
    # dA -> a -> a -> dA and dB -> b -> b -> dB: 3 hops of cost 1 each, F = 2
    assert p.evaluate(stages) == (2, 6.0)
    assert p.objective(stages) == pytest.approx(1.5)
    # the site-blind split (a's in stage 0, b's in stage 1) crosses twice per path
    assert p.evaluate({"a1": 0, "a2": 0, "b1": 1, "b2": 1}) == (2, 2 * (1 + 100 + 100))


def test_shares_split_a_round_in_proportion_to_the_demands() -> None:
    p = SwarmProblem(1, {"r": 5}, {"x": 3, "y": 1, "z": 0})
    assert p.shares(4) == {"x": 3, "y": 1, "z": 0}
    assert p.shares(2) == {"x": 2, "y": 0, "z": 0}  # 1.5 and 0.5: the larger remainder wins the tie by id
    assert p.shares(10) == {"x": 3, "y": 1, "z": 0}  # never more than the demand
    assert p.shares(0) == {}


def test_a_cheap_chain_near_one_data_node_does_not_stand_for_the_others() -> None:
    """One stage of capacity 1 (F = 1) next to dA would route only dA's unit at cost 2: the round's share gives
    F = 1 to one data node, and a second relay in that stage (F = 2) must carry dB's unit too."""
    p = SwarmProblem(1, {"a": 1, "b": 1}, {"dA": 1, "dB": 1},
                     {("a", "dA"): 1.0, ("b", "dB"): 1.0, ("a", "dB"): 50.0, ("b", "dA"): 50.0})
    assert p.evaluate({"a": 0, "b": 0}) == (2, 4.0)


def _random_problem(rng: random.Random, relays: int, data: int, stages: int) -> SwarmProblem:
    sites = [(rng.random(), rng.random()) for _ in range(5)]
    where = {}
    names = [f"r{i}" for i in range(relays)] + [f"d{i}" for i in range(data)]
    for n in names:
        where[n] = rng.choice(sites)
    links = {}
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            links[(x, y) if x < y else (y, x)] = 1.0 + 100 * math.dist(where[x], where[y])
    return SwarmProblem(stages, {f"r{i}": rng.randint(1, 4) for i in range(relays)},
                        {f"d{i}": 4 for i in range(data)}, links)


@pytest.mark.parametrize("seed", range(6))
def test_every_relay_gets_one_stage_and_the_search_never_ends_worse_than_its_starts(seed: int) -> None:
    rng = random.Random(seed)
    p = _random_problem(rng, relays=rng.randint(5, 14), data=rng.randint(1, 4), stages=rng.randint(2, 5))
    stages = place_swarm(p)
    assert set(stages) == set(p.relays) and all(0 <= s < p.num_stages for s in stages.values())
    water = _quotas(p)
    quota = [0] * p.num_stages
    for s in water.values():
        quota[s] += 1
    chains = _chains(p, quota)
    assert set(chains) == set(p.relays)
    assert p.objective(stages) <= min(p.objective(water), p.objective(chains)) + 1e-9
    assert place_swarm(p) == stages  # deterministic
    # a budget of one evaluation returns the better start as it is
    assert p.objective(place_swarm(p, max_evaluations=2)) == pytest.approx(
        min(p.objective(water), p.objective(chains)))


def test_water_filling_balances_the_stage_capacities() -> None:
    p = SwarmProblem(3, {"a": 4, "b": 3, "c": 2, "d": 2, "e": 1}, {"x": 1})
    caps = [0, 0, 0]
    for r, s in _quotas(p).items():
        caps[s] += p.relays[r]
    assert sorted(caps) == [4, 4, 4]


def test_told_links_average_both_ends_and_drop_bad_costs() -> None:
    got = told_links({"a": (("b", 2.0), ("c", -1.0), ("d", math.inf)), "b": (("a", 4.0), ("c", math.nan)),
                      "c": (("c", 1.0), ("a", 5.0))}.items())
    assert got == {("a", "b"): 3.0, ("a", "c"): 5.0}


def test_bad_problems_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one stage"):
        SwarmProblem(0, {"a": 1}, {"d": 1})
    with pytest.raises(ValueError, match="both a relay and a data node"):
        SwarmProblem(1, {"a": 1}, {"a": 1})
    with pytest.raises(ValueError, match="non-negative integer"):
        SwarmProblem(1, {"a": -1}, {"d": 1})


def test_the_whole_swarm_placement_applies_only_to_a_swarm_it_can_place() -> None:
    cands = [Candidate(n, 1, (1.0, 1.0)) for n in ("a1", "a2", "b1", "b2")]
    told = {"a1": (("dA", 1.0), ("a2", 1.0), ("b1", 100.0))}
    assert place_new_swarm(cands[:1], told, ("dA",), 2) is None  # fewer candidates than stages
    assert place_new_swarm(cands, told, (), 2) is None  # no data node
    assert place_new_swarm(cands, {}, ("dA",), 2) is None  # nobody told a link
    blocked = cands[:3] + [Candidate("b2", 1, (1.0, math.inf))]
    assert place_new_swarm(blocked, told, ("dA",), 2) is None  # one cannot serve stage 1
    assert set(place_new_swarm(cands, told, ("dA",), 2)) == {"a1", "a2", "b1", "b2"}


SITES = {"dA": "A", "dB": "B", "r1": "A", "r2": "A", "r3": "B", "r4": "B", "r5": "A", "r6": "B"}


def _leader_round(evaluations: int) -> tuple[SwarmProblem, dict[str, int], list[Assignment], MembershipMachine]:
    """Six candidates of capacity 1 at two sites ask a leader (data nodes dA, dB) of a 3-stage swarm with no
    member yet; every link costs 1 within a site and 100 across."""
    links = {(x, y): 1.0 if SITES[x] == SITES[y] else 100.0 for x in SITES for y in SITES if x < y}
    p = SwarmProblem(3, {r: 1 for r in SITES if r.startswith("r")}, {"dA": 1, "dB": 1}, links)
    m = MembershipMachine(MembershipConfig("dA", 3, data_nodes=("dA", "dB"), swarm_evaluations=evaluations),
                          term=1, iteration=0)
    for c in sorted(p.relays):
        m.on_message(0.0, c, JoinRequest(1, (1.0, 1.0, 1.0), tuple((x, p.cost(c, x)) for x in SITES if x != c)))
    out = m.on_timer(0.0, "membership.round") + m.on_timer(1.0, "membership.collect")
    got = [e.msg for e in out if type(e) is Send and type(e.msg) is Assignment]
    return p, {a.node: a.stage for a in got}, got, m


def test_the_leader_places_a_swarm_forming_from_scratch_as_a_whole() -> None:
    p, stage, got, m = _leader_round(evaluations=100)
    assert sorted(stage) == sorted(p.relays) and m.swarm_placed == 6
    for k in range(3):  # one relay of each site per stage: each data node's chain stays at home
        assert sorted(SITES[r] for r in stage if stage[r] == k) == ["A", "B"]
    assert p.evaluate(stage) == (2, 8.0)
    assert all(a.download_from == INITIAL and a.start_iteration == 0 for a in got)
    # without it (budget 0) the round's search cannot tell the data nodes apart (they are one side of its
    # graph) and water-fills the candidates in id order: r2 and r5 share a stage, so a path crosses sites
    _, blind, _, m = _leader_round(evaluations=0)
    assert m.swarm_placed == 0
    assert blind == {"r1": 0, "r2": 1, "r3": 2, "r4": 0, "r5": 1, "r6": 2}
    assert p.objective(blind) > 10 * p.objective(stage)
