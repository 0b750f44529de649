"""Choosing the stages of joiners by the cost of the routing they make possible (section V-B of GWTF).

Theory of operation
-------------------
The paper's leader gives the candidate of highest capacity to the most
utilized stage.  That raises the maximum flow F, but the extra flow may have
to cross expensive links, and what the run pays is the time to push a batch:
B / F rounds of mean path cost C / F, so

    objective = C / F^2          (F: maximum flow, C: its least total path cost)

(B, the microbatches of a batch, is a constant factor and left out).  With
the layered cost graph in hand (each stage's members, their links to the next
stage, each candidate's links), the leader evaluates the objective of an
assignment of the candidates to stages exactly: F is the smallest stage
capacity when consecutive stages are fully linked, and C one min-cost flow
(`min_cost_flow`, successive shortest paths with Dijkstra and potentials,
pure Python).

`search_stages` is a local search: from each start (water-filling, the paper's
rank matching; the caller passes them), move one candidate to another stage it
may serve, keeping every move that lowers (objective, join delay); first
improvement, candidates in index order, at most `passes` passes.  The best of
the refined starts wins; the answer is never worse than any start.  The
search stops when it has spent `max_evaluations` exact evaluations (a
deterministic budget, not wall time, so the leader's choice is reproducible
and its CPU bounded by budget x the cost of one min-cost flow).

What the leader knows.  `PlacementProblem.links` holds the link costs that
were measured; a link that is not there costs the mean of its two ends' own
costs: a candidate's is what it reported for its stage
(`Candidate.stage_costs`), a member's or the data nodes' is
`unknown_link_cost`.  Members of a stage without any known link are
interchangeable, so they are merged into one node per stage.  With no link
measured at all (what the daemon's leader holds today) a unit's path cost is
a sum of node costs, the cheapest routing fills each stage's cheapest
capacity first, and an evaluation is a sort per stage instead of a min-cost
flow (`CostModel._separable_cost`).  The
join delay of an assignment is the largest cost a newcomer reported for its
stage (its state download runs over those links); it breaks ties.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence


DEFAULT_MAX_EVALUATIONS = 400  # exact evaluations a leader spends per placement round (docs/bench_join.md)
SEARCH_PASSES = 3  # passes over all single-candidate moves
DATA = "\x00data"  # the data nodes' side of the graph: source before the first stage, sink after the last
_BIG = 1 << 60  # link capacity: links never limit the flow, nodes do
_EPS = 1e-9

Assignment = tuple[int, ...]  # stage of each candidate, in `PlacementProblem.candidates` order


@dataclass(frozen=True)
class Candidate:
    node: str
    capacity: int
    stage_costs: tuple[float, ...]  # measured cost to each stage, +inf: cannot serve it


@dataclass
class StageLoad:
    flows: int = 0
    capacity: int = 0

    @property
    def utilization(self) -> float:
        return self.flows / self.capacity if self.capacity > 0 else math.inf


@dataclass(frozen=True)
class Member:
    node: str
    stage: int
    capacity: int


@dataclass(frozen=True)
class PlacementProblem:
    """A snapshot the leader holds: the stages' members, the candidates, the link costs it knows."""

    num_stages: int
    members: tuple[Member, ...]
    candidates: tuple[Candidate, ...]
    links: Mapping[tuple[str, str], float] = field(default_factory=dict)  # sorted pair -> cost; DATA: data nodes
    unknown_link_cost: float = 1.0  # a link between two members nobody measured

    def link(self, a: str, b: str) -> float | None:
        return self.links.get((a, b) if a < b else (b, a))

    def allowed(self, k: int) -> list[int]:
        """Stages candidate k may serve: a finite reported cost."""
        costs = self.candidates[k].stage_costs
        return [s for s in range(self.num_stages) if s < len(costs) and math.isfinite(costs[s])]

    def stage_capacities(self, assign: Assignment) -> list[int]:
        caps = [0] * self.num_stages
        for m in self.members:
            caps[m.stage] += m.capacity
        for c, s in zip(self.candidates, assign):
            caps[s] += c.capacity
        return caps

    def join_delay(self, assign: Assignment) -> float:
        return max((c.stage_costs[s] for c, s in zip(self.candidates, assign)), default=0.0)


def told_links(told: Iterable[tuple[str, Iterable[tuple[str, float]]]],
               alias: Mapping[str, str] | None = None) -> dict[tuple[str, str], float]:
    """The link costs nodes told ((node, its (peer, cost) pairs), in the order given), keyed by sorted pair; a
    link told by both ends costs the mean of what was told.  `alias` renames nodes first (the data nodes as one
    side of the graph, `DATA`).  Self-links and negative, infinite or NaN costs are dropped."""
    alias = alias or {}
    seen: dict[tuple[str, str], list[float]] = {}
    for a, costs in told:
        for b, c in costs:
            x, y = alias.get(a, a), alias.get(b, b)
            if x != y and isinstance(c, (int, float)) and math.isfinite(c) and c >= 0:
                seen.setdefault((x, y) if x < y else (y, x), []).append(float(c))
    return {pair: sum(cs) / len(cs) for pair, cs in seen.items()}


@dataclass(frozen=True)
class Evaluation:
    flow: int  # F
    total_cost: float  # C

    @property
    def objective(self) -> float:
        return self.total_cost / self.flow ** 2 if self.flow > 0 else math.inf


def min_cost_flow(num_nodes: int, edges: Iterable[tuple[int, int, int, float]], source: int, sink: int,
                  value: int) -> float | None:
    """Least total cost of `value` units from `source` to `sink` over (from, to, capacity, cost) edges with
    non-negative costs: successive shortest paths (Dijkstra on reduced costs).  None: `value` cannot pass."""
    head: list[list[int]] = [[] for _ in range(num_nodes)]
    to: list[int] = []
    cap: list[int] = []
    cost: list[float] = []
    for u, v, c, w in edges:
        head[u].append(len(to))
        to.append(v)
        cap.append(c)
        cost.append(w)
        head[v].append(len(to))
        to.append(u)
        cap.append(0)
        cost.append(-w)
    potential = [0.0] * num_nodes
    sent, total = 0, 0.0
    while sent < value:
        dist = [math.inf] * num_nodes
        via = [-1] * num_nodes
        dist[source] = 0.0
        heap = [(0.0, source)]
        while heap:
            d, u = heapq.heappop(heap)
            if d > dist[u]:
                continue
            pu = potential[u]
            for e in head[u]:
                if cap[e] > 0:
                    v = to[e]
                    nd = d + cost[e] + pu - potential[v]
                    if nd < dist[v] - _EPS:  # (float costs: no relaxation around a zero-cost cycle)
                        dist[v], via[v] = nd, e
                        heapq.heappush(heap, (nd, v))
        if dist[sink] == math.inf:
            return None
        cut = dist[sink]
        for i, d in enumerate(dist):
            potential[i] += min(d, cut)  # keeps every residual reduced cost >= 0, reached or not
        push, v = value - sent, sink
        while v != source:
            e = via[v]
            push = min(push, cap[e])
            v = to[e ^ 1]
        v = sink
        while v != source:
            e = via[v]
            cap[e] -= push
            cap[e ^ 1] += push
            v = to[e ^ 1]
        sent += push
        total += push * (potential[sink] - potential[source])
    return total


class CostModel:
    """Exact evaluation of assignments of one `PlacementProblem`, cached; counts what it computed."""

    def __init__(self, problem: PlacementProblem) -> None:
        self.problem = problem
        self.evaluations = 0
        self._cache: dict[Assignment, Evaluation] = {}
        linked = {n for pair in problem.links for n in pair}
        # Members with a known link keep their own node; the others merge into one node per stage.
        self._own = sorted((m for m in problem.members if m.node in linked), key=lambda m: m.node)
        self._merged = [0] * problem.num_stages
        for m in problem.members:
            if m.node not in linked:
                self._merged[m.stage] += m.capacity

    def evaluate(self, assign: Assignment) -> Evaluation:
        assign = tuple(assign)
        hit = self._cache.get(assign)
        if hit is None:
            hit = self._compute(assign)
            self._cache[assign] = hit
            self.evaluations += 1
        return hit

    def _compute(self, assign: Assignment) -> Evaluation:
        p = self.problem
        flow = min(p.stage_capacities(assign))
        if flow <= 0:
            return Evaluation(0, 0.0)
        if not p.links:
            return Evaluation(flow, self._separable_cost(assign, flow))
        # Graph nodes: (name, stage, capacity, reported stage cost or None for a member).
        nodes: list[tuple[str | None, int, int, float | None]] = [(m.node, m.stage, m.capacity, None) for m in self._own]
        nodes += [(None, s, cap, None) for s, cap in enumerate(self._merged) if cap > 0]
        nodes += [(c.node, s, c.capacity, c.stage_costs[s]) for c, s in zip(p.candidates, assign)]
        by_stage: list[list[int]] = [[] for _ in range(p.num_stages)]
        for i, nd in enumerate(nodes):
            by_stage[nd[1]].append(i)
        source, sink = 2 * len(nodes), 2 * len(nodes) + 1

        def own(x: tuple) -> float:
            return x[3] if x[3] is not None else p.unknown_link_cost

        def pair_cost(a: tuple, b: tuple) -> float:
            known = p.link(a[0], b[0]) if a[0] is not None and b[0] is not None else None
            return known if known is not None else (own(a) + own(b)) / 2

        data = (DATA, -1, 0, None)

        edges: list[tuple[int, int, int, float]] = [(2 * i, 2 * i + 1, nd[2], 0.0) for i, nd in enumerate(nodes)]
        edges += [(source, 2 * i, _BIG, pair_cost(nodes[i], data)) for i in by_stage[0]]
        edges += [(2 * i + 1, sink, _BIG, pair_cost(nodes[i], data)) for i in by_stage[-1]]
        for s in range(p.num_stages - 1):
            for i in by_stage[s]:
                for j in by_stage[s + 1]:
                    if nodes[i][0] is None or nodes[i][0] != nodes[j][0]:
                        edges.append((2 * i + 1, 2 * j, _BIG, pair_cost(nodes[i], nodes[j])))
        total = min_cost_flow(2 * len(nodes) + 2, edges, source, sink, flow)
        if total is None:
            raise ValueError(f"no routing of {flow} units: a stage is not linked to the next")
        return Evaluation(flow, total)


    def _separable_cost(self, assign: Assignment, flow: int) -> float:
        """With no link measured every link costs the mean of its ends' costs, so a unit's path costs
        unknown_link_cost (its two data ends) plus the cost of each node it crosses, and the cheapest
        routing fills each stage's cheapest capacity first: no flow problem to solve."""
        p = self.problem
        per_stage: list[list[tuple[float, int]]] = [[] for _ in range(p.num_stages)]
        for s, cap in enumerate(self._merged):
            if cap > 0:
                per_stage[s].append((p.unknown_link_cost, cap))
        for c, s in zip(p.candidates, assign):
            per_stage[s].append((c.stage_costs[s], c.capacity))
        total = flow * p.unknown_link_cost
        for options in per_stage:
            left = flow
            for unit_cost, cap in sorted(options):
                take = min(left, cap)
                total += take * unit_cost
                left -= take
                if left == 0:
                    break
        return total


Evaluator = Callable[[Assignment], float]  # the objective of an assignment (anything proportional to C / F^2)


def search_stages(problem: PlacementProblem, starts: Sequence[Assignment], *,
                  objective: Evaluator | None = None, max_evaluations: int = DEFAULT_MAX_EVALUATIONS,
                  passes: int = SEARCH_PASSES) -> Assignment:
    """The best assignment the local search finds from `starts` (module docstring).

    `objective` defaults to the exact `CostModel` of `problem`; a caller holding
    a faster exact evaluator of the same objective (the simulator's LP) may pass
    it.  Evaluations of distinct assignments are counted against
    `max_evaluations`; once spent, the best assignment seen so far is returned.
    """
    if not problem.candidates:
        return ()
    if objective is None:
        model = CostModel(problem)
        objective = lambda a: model.evaluate(a).objective  # noqa: E731
    seen: dict[Assignment, tuple[float, float]] = {}

    def key(a: Assignment) -> tuple[float, float] | None:
        hit = seen.get(a)
        if hit is None:
            if len(seen) >= max_evaluations:
                return None
            hit = seen[a] = (round(objective(a), 9), problem.join_delay(a))
        return hit

    allowed = [problem.allowed(k) for k in range(len(problem.candidates))]
    ordered = [a for a in dict.fromkeys(tuple(s) for s in starts) if key(a) is not None]
    found: list[Assignment] = []
    for start in sorted(ordered, key=lambda a: (*seen[a], a)):  # the most promising start is refined first
        cur, best = start, seen[start]
        for _ in range(passes):
            improved = False
            for k, stages in enumerate(allowed):
                for s in stages:
                    if s == cur[k]:
                        continue
                    trial = cur[:k] + (s,) + cur[k + 1:]
                    kt = key(trial)
                    if kt is None:
                        break
                    if kt < best:
                        cur, best, improved = trial, kt, True
                else:
                    continue
                break
            if not improved or len(seen) >= max_evaluations:
                break
        found.append(cur)
    if not found:
        return tuple(starts[0])
    return min(found, key=lambda a: (*seen[a], a))


def rank_matching(candidates: Sequence[Candidate], loads: Mapping[int, StageLoad],
                  eligible: Sequence[int]) -> dict[str, int]:
    """V-B as written: periods of up to len(eligible) candidates; in each, the highest capacity goes to the
    most utilized stage, the second to the second, and so on; the next period sees the capacities added.
    A candidate that cannot serve its rank's stage takes the next stage of the ranking it can serve."""
    caps = {s: loads[s].capacity for s in eligible}
    flows = {s: loads[s].flows for s in eligible}
    order = sorted(candidates, key=lambda c: (-c.capacity, c.node))
    out: dict[str, int] = {}
    period = max(1, len(eligible))
    for start in range(0, len(order), period):
        ranked = sorted(eligible, key=lambda t: (-(flows[t] / caps[t] if caps[t] else math.inf), t))
        free = list(ranked)
        for c in order[start:start + period]:
            options = [s for s in free if s < len(c.stage_costs) and math.isfinite(c.stage_costs[s])]
            if not options:
                continue
            out[c.node] = options[0]
            free.remove(options[0])
            caps[options[0]] += c.capacity
    return out
