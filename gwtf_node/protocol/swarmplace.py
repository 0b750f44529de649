"""Placing a whole swarm at once: every relay's stage chosen by the cost of the flows its links make possible.

Theory of operation
-------------------
`placement.py` places the joiners of one leader round beside members that
stay where they are, with the data nodes merged into one side of a single
flow.  A swarm whose relays all arrive together (a run that starts with its
volunteers) can do better: nobody has a stage yet, so any relay can go
anywhere, and a relay next to a data node, or next to another relay, can be
put in the stage where that short link carries the data node's microbatches.

What an assignment costs.  Each data node's microbatches go out through
every stage and come back to that data node, so the routing is a
multi-commodity flow (one commodity per data node, with its demand), the
relays' capacities shared between them.  `SwarmProblem.evaluate` routes it
greedily: the cheapest path of any data node with demand left over the
relays with room (a shortest path through the layered graph, including the
hops out of and back into that data node), as many units as its demand and
the path's room allow, again until no demand is left or no path has room.
What is routed is one round of the batch: the maximum flow (the smallest
stage capacity, at most the total demand) split among the data nodes in
proportion to their demands (`SwarmProblem.shares`), so that a cheap chain
near one data node does not stand for the units of the others.  F is the
units routed, C their summed path costs, and the objective is GWTF's
C / F^2 (`placement.py`): B / F rounds of mean path cost C / F.  The greedy routing is not the exact
multi-commodity optimum (an LP), but it is deterministic, pure Python and
fast enough to evaluate a few thousand assignments of a hundred relays.

The search (`place_swarm`).  Two starts: water-filling (relays by capacity,
each to the stage with the least capacity so far) and greedy chains (each
data node in turn, the relay with room nearest to the previous hop in every
stage, the hop back to the data node counted in the last one, stage quotas
as water-filling gives them; whatever is left by water-filling).  From the
better start, a local search over swaps of two relays of different stages
(which keep every stage's capacity when the two have the same) and moves of
one relay to another stage, first improvement, until a pass improves
nothing or `max_evaluations` assignments were evaluated.  Deterministic:
relays and data nodes are taken in id order, no randomness.

A link nobody reported costs `unknown_link_cost` (default: the mean of the
known ones), as a leader would assume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .placement import Candidate, told_links

DEFAULT_SWARM_EVALUATIONS = 3000  # assignments a whole-swarm placement evaluates at most
# A leader's whole-swarm placement evaluates at most this many (data node x relay x relay-of-a-stage) path
# steps in all: one evaluation costs about data nodes x relays^2 / stages of them, so a large swarm gets fewer
# evaluations (144 nodes: ~430) and the round stays within seconds of CPU (docs/bench_optimality.md).
MAX_SWARM_WORK = 30_000_000


@dataclass(frozen=True)
class SwarmProblem:
    """Relays to place (id -> capacity), data nodes (id -> demand in units), link costs by sorted pair."""

    num_stages: int
    relays: Mapping[str, int]
    data: Mapping[str, int]
    links: Mapping[tuple[str, str], float] = field(default_factory=dict)
    unknown_link_cost: float | None = None

    def __post_init__(self) -> None:
        if self.num_stages < 1:
            raise ValueError(f"num_stages is {self.num_stages}: a swarm needs at least one stage")
        if set(self.relays) & set(self.data):
            raise ValueError("a node is both a relay and a data node")
        for n, c in list(self.relays.items()) + list(self.data.items()):
            if not isinstance(c, int) or c < 0:
                raise ValueError(f"{n}: capacity or demand {c!r} is not a non-negative integer")
        unknown = self.unknown_link_cost
        if unknown is None:
            unknown = sum(self.links.values()) / len(self.links) if self.links else 1.0
        object.__setattr__(self, "_unknown", unknown)
        nested: dict[str, dict[str, float]] = {}
        for (a, b), c in self.links.items():
            nested.setdefault(a, {})[b] = c
            nested.setdefault(b, {})[a] = c
        object.__setattr__(self, "_nested", nested)

    def cost(self, a: str, b: str) -> float:
        return self._nested.get(a, {}).get(b, self._unknown)

    def evaluate(self, stages: Mapping[str, int]) -> tuple[int, float]:
        """(F, C) of the greedy multi-commodity routing of `stages` (relay -> stage): module docstring."""
        S = self.num_stages
        layers: list[list[str]] = [[] for _ in range(S)]
        for r in sorted(stages):
            layers[stages[r]].append(r)
        room = {r: self.relays[r] for r in stages}
        caps = [sum(room[r] for r in layer) for layer in layers]
        demand = {d: u for d, u in self.shares(min(caps)).items() if u > 0}
        total_units, total_cost = 0, 0.0
        paths: dict[str, tuple[float, list[str]] | None] = {}
        while demand:
            for d in demand:
                if d not in paths or (paths[d] is not None and any(room[r] == 0 for r in paths[d][1])):
                    paths[d] = self._cheapest(d, layers, room)
            live = [(p[0], d) for d, p in paths.items() if d in demand and p is not None]
            if not live:
                break
            cost, d = min(live)
            path = paths[d][1]
            units = min([demand[d]] + [room[r] for r in path])
            for r in path:
                room[r] -= units
            demand[d] -= units
            if demand[d] == 0:
                del demand[d]
            total_units += units
            total_cost += units * cost
        return total_units, total_cost

    def shares(self, flow: int) -> dict[str, int]:
        """`flow` units (at most the total demand) split among the data nodes in proportion to their demands,
        largest remainders first (then by id): each data node's part of one round of the batch."""
        total = sum(self.data.values())
        flow = min(flow, total)
        if flow <= 0:
            return {}
        exact = {d: flow * u / total for d, u in self.data.items()}
        out = {d: int(x) for d, x in exact.items()}
        for d in sorted(exact, key=lambda d: (out[d] - exact[d], d))[:flow - sum(out.values())]:
            out[d] += 1
        return dict(sorted(out.items()))

    def _cheapest(self, d: str, layers: list[list[str]], room: Mapping[str, int]) -> tuple[float, list[str]] | None:
        """The cheapest path out of data node `d` through one relay with room per stage and back to `d`."""
        unknown, nested = self._unknown, self._nested
        prev: list[tuple[str, float, list[str]]] = [(d, 0.0, [])]
        for layer in layers:
            cur = []
            for r in layer:
                if room[r] <= 0:
                    continue
                row = nested.get(r, {})
                best, via = math.inf, None
                for pn, pc, pp in prev:
                    c = pc + row.get(pn, unknown)
                    if c < best:
                        best, via = c, pp
                cur.append((r, best, via + [r]))
            if not cur:
                return None
            prev = cur
        row = nested.get(d, {})
        return min(((c + row.get(r, unknown), path) for r, c, path in prev), key=lambda x: x[0])

    def objective(self, stages: Mapping[str, int]) -> float:
        flow, cost = self.evaluate(stages)
        return cost / flow ** 2 if flow > 0 else math.inf


def _quotas(problem: SwarmProblem) -> dict[str, int]:
    """Water-filling: relays by capacity (highest first, then id), each to the stage with the least so far."""
    caps = [0] * problem.num_stages
    out = {}
    for r in sorted(problem.relays, key=lambda r: (-problem.relays[r], r)):
        s = min(range(problem.num_stages), key=lambda k: (caps[k], k))
        out[r] = s
        caps[s] += problem.relays[r]
    return out


def _chains(problem: SwarmProblem, quota: Sequence[int]) -> dict[str, int]:
    """Greedy chains: each data node takes the free relay nearest to its previous hop in every stage."""
    left = list(quota)
    free = set(problem.relays)
    out: dict[str, int] = {}
    S = problem.num_stages
    for d in sorted(problem.data):
        at = d
        for k in range(S):
            if left[k] == 0 or not free:
                break
            back = (lambda r: problem.cost(r, d)) if k == S - 1 else (lambda r: 0.0)
            r = min(free, key=lambda r: (problem.cost(at, r) + back(r), r))
            out[r] = k
            free.discard(r)
            left[k] -= 1
            at = r
    for r in sorted(free, key=lambda r: (-problem.relays[r], r)):
        k = max(range(S), key=lambda k: (left[k], -k))
        out[r] = k
        left[k] -= 1
    return out


def place_swarm(problem: SwarmProblem, max_evaluations: int = DEFAULT_SWARM_EVALUATIONS) -> dict[str, int]:
    """Every relay's stage (module docstring)."""
    if not problem.relays:
        return {}
    seen: dict[tuple[int, ...], float] = {}
    order = sorted(problem.relays)

    def key(stages: Mapping[str, int]) -> float | None:
        t = tuple(stages[r] for r in order)
        hit = seen.get(t)
        if hit is None:
            if len(seen) >= max_evaluations:
                return None
            hit = seen[t] = round(problem.objective(stages), 9)
        return hit

    water = _quotas(problem)
    quota = [0] * problem.num_stages
    for s in water.values():
        quota[s] += 1
    starts = [water, _chains(problem, quota)]
    cur = min(starts, key=lambda a: (key(a), tuple(a[r] for r in order)))
    best = key(cur)
    while True:
        improved = False
        for i, a in enumerate(order):
            for b in order[i + 1:]:
                if cur[a] == cur[b]:
                    continue
                trial = dict(cur)
                trial[a], trial[b] = cur[b], cur[a]
                kt = key(trial)
                if kt is None:
                    return cur
                if kt < best:
                    cur, best, improved = trial, kt, True
            for s in range(problem.num_stages):
                if s == cur[a]:
                    continue
                trial = dict(cur)
                trial[a] = s
                kt = key(trial)
                if kt is None:
                    return cur
                if kt < best:
                    cur, best, improved = trial, kt, True
        if not improved:
            return cur


def place_new_swarm(candidates: Sequence[Candidate], told: Mapping[str, Iterable[tuple[str, float]]],
                    data_nodes: Sequence[str], num_stages: int,
                    max_evaluations: int = DEFAULT_SWARM_EVALUATIONS) -> dict[str, int] | None:
    """The leader's placement of a swarm forming from scratch: every candidate's stage by `place_swarm` over
    the links the candidates told (`told`: node -> its link costs).  None when it does not apply: fewer
    candidates than stages, no data node, no link told, or a candidate that cannot serve every stage (the
    round's search then places them).  Each data node's demand is the candidates' whole capacity, so the
    smallest stage capacity is the flow and the data nodes share it equally."""
    if len(candidates) < num_stages or not data_nodes:
        return None
    if any(len(c.stage_costs) < num_stages or not all(math.isfinite(x) for x in c.stage_costs[:num_stages])
           for c in candidates):
        return None
    links = told_links(sorted(told.items()))
    if not links:
        return None
    total = sum(c.capacity for c in candidates)
    work = max(1, len(set(data_nodes)) * len(candidates) ** 2 // num_stages)
    max_evaluations = max(2, min(max_evaluations, MAX_SWARM_WORK // work))
    problem = SwarmProblem(num_stages, {c.node: c.capacity for c in candidates},
                           {d: total for d in sorted(set(data_nodes))}, links)
    return place_swarm(problem, max_evaluations)
