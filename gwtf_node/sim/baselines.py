"""Reference routings for the flow tests: the optimum and SWARM's greedy rule.

The routing problem (section V-A of the GWTF paper, Table V for the tests).
Every microbatch leaves its data node d, visits exactly one relay of each
stage 0..S-1 in order, and comes back to the same d.  Only links between
consecutive stages count (d -> stage 0, stage s -> stage s+1, stage S-1 -> d);
any other link is ignored.  A relay holds at most `capacity` microbatches and
a data node sends at most `capacity`; links are unlimited.  A routing is
scored by its number of flows first and by the sum of their path costs
(Equation 2) second.

Layered, node-split graph.  Each relay r becomes in(r) -> out(r) with
capacity cap(r); each data node d becomes a source side src(d) and a sink side
snk(d).  A microbatch is then one unit of flow src(d) -> in(r0) -> out(r0) ->
... -> out(r_{S-1}) -> snk(d), and a routing is an integral flow.

One data node.  This is the classical minimum-cost maximum-flow problem
(Ford-Fulkerson's problem, [19] of the paper).  Its constraint matrix is
totally unimodular, so an integral optimum exists; networkx's network simplex
finds one (`nx.max_flow_min_cost`).  Network simplex wants integer weights, so
costs are scaled by `COST_SCALE` and rounded; the cost of each path is then
recomputed from the scenario.  The edge flows are split into unit paths by
always following the smallest node id, so the result is deterministic.

Several data nodes.  "A source must deliver to its own sink" makes this a
multi-commodity flow (the paper does not compare tests 5 and 6 with an
optimum for this reason).  Merging all data nodes into one super source and
one super sink gives a single-commodity relaxation whose maximum flow
(`max_flow_value`) is only an upper bound: a unit may leave d0 and arrive at
d1.  The exact fractional optimum is a linear programme with a variable
f_k(e) >= 0 per commodity k and layered link e, solved with HiGHS in two
phases:

  1. maximise sum_k f_k(out of d_k) subject to conservation of every
     commodity at every relay, sum_k inflow_k(r) <= cap(r) and
     f_k(out of d_k) <= cap(d_k);
  2. with the total fixed at that maximum F, minimise sum_k,e cost(e) f_k(e).

Multi-commodity LPs are not totally unimodular, so this is a bound
(`lp_max_flow`, `lp_bound_total_cost`, `lp_bound_mean_cost` in `extra`, next
to `single_commodity_max_flow`).  When the LP optimum is integral (test1, all
setting-5 seeds, about half of setting 6's) it decomposes exactly into unit
paths.  Otherwise the same programme is solved as an integer programme
(`scipy.optimize.milp`, HiGHS branch and bound, well under a second on setting
6 though greedy rounding of the LP lost up to 20% there); if that finds
nothing within `MILP_TIME_LIMIT_S`, units are peeled off along edges carrying
>= 1 of their commodity and the rest is filled with each data node's cheapest
free route in turn.  `extra["integral_method"]` ("lp", "milp",
"milp-time-limit" or "rounding") says which case happened; `flows` is always
a legal routing of at most `lp_max_flow` flows.

SWARM (the paper's baseline, "sending to the next stage closest node").  The
data nodes take turns, one microbatch each.  At every hop the microbatch goes
to the cheapest linked relay of the next stage that still has room (ties by
id); the last relay must link back to the data node.  A microbatch that gets
stuck is dropped and its reservations are released; a data node stops after
it has sent its capacity or after `SWARM_MAX_FAILURES` drops in a row.  It
never looks ahead, so it can fill a relay that a later microbatch needed and
can pick a cheap first hop that leads to an expensive second one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import csr_matrix, vstack

from ..protocol.scenario import Scenario
from .result import Flow, RoutingResult, path_cost

COST_SCALE = 1000  # float costs -> integer weights for network simplex
SWARM_MAX_FAILURES = 3  # consecutive drops after which a data node gives up
EPS = 1e-6  # integrality / flow tolerance on LP values
MILP_TIME_LIMIT_S = 10.0  # branch and bound budget when the LP optimum is fractional

_SRC = ("0", "super-source")  # tuples so that every graph node sorts with the others
_SNK = ("0", "super-sink")


@dataclass(frozen=True)
class _Layered:
    """The links that a microbatch may use, oriented along the pipeline."""

    stages: int
    data: tuple[str, ...]  # data node ids, sorted
    data_cap: dict[str, int]
    relay_cap: dict[str, int]  # relays with positive capacity only
    first: dict[str, tuple[tuple[str, float], ...]]  # d -> ((stage-0 relay, cost), ...)
    nxt: dict[str, tuple[tuple[str, float], ...]]  # relay -> ((next-stage relay, cost), ...)
    last: dict[str, tuple[tuple[str, float], ...]]  # d -> ((stage S-1 relay, cost), ...)


def _layered(scenario: Scenario) -> _Layered:
    s = scenario.stages
    relay_cap = {n.id: n.capacity for n in scenario.relays if n.capacity > 0}
    stage = {r: scenario.node(r).stage for r in relay_cap}
    data = tuple(sorted(n.id for n in scenario.data_nodes))
    first: dict[str, list] = {d: [] for d in data}
    last: dict[str, list] = {d: [] for d in data}
    nxt: dict[str, list] = {r: [] for r in relay_cap}
    for d in data:
        for other, link in scenario.neighbours(d).items():
            if other in relay_cap:
                if stage[other] == 0:
                    first[d].append((other, link.cost))
                if stage[other] == s - 1:
                    last[d].append((other, link.cost))
    for a in relay_cap:
        for b, link in scenario.neighbours(a).items():
            if b in relay_cap and stage[b] == stage[a] + 1:
                nxt[a].append((b, link.cost))
    key = lambda t: t[0]  # noqa: E731
    return _Layered(
        s, data, {d: scenario.node(d).capacity for d in data}, relay_cap,
        {d: tuple(sorted(v, key=key)) for d, v in first.items()},
        {r: tuple(sorted(v, key=key)) for r, v in nxt.items()},
        {d: tuple(sorted(v, key=key)) for d, v in last.items()},
    )


def _flow_graph(lay: _Layered, limit: int | None = None) -> nx.DiGraph:
    """Node-split graph from _SRC to _SNK over all data nodes (merged commodities)."""
    g = nx.DiGraph()
    g.add_nodes_from((_SRC, _SNK))
    scale = lambda c: int(round(c * COST_SCALE))  # noqa: E731
    for d in lay.data:
        cap = lay.data_cap[d] if limit is None else min(lay.data_cap[d], limit)
        g.add_edge(_SRC, ("src", d), capacity=cap, weight=0)
        g.add_edge(("snk", d), _SNK, capacity=lay.data_cap[d], weight=0)
        for r, c in lay.first[d]:
            g.add_edge(("src", d), ("in", r), weight=scale(c))
        for r, c in lay.last[d]:
            g.add_edge(("out", r), ("snk", d), weight=scale(c))
    for r, cap in lay.relay_cap.items():
        g.add_edge(("in", r), ("out", r), capacity=cap, weight=0)
        for b, c in lay.nxt[r]:
            g.add_edge(("out", r), ("in", b), weight=scale(c))
    return g


def flow_network(scenario: Scenario) -> nx.DiGraph:
    """The node-split graph over every data node (merged commodities): `("src", d)` > `("in", r)` > `("out", r)`
    > `("snk", d)`, link costs x COST_SCALE as `weight`, relay and data-node capacities as `capacity` (none on a
    link: unbounded), from a super-source to a super-sink (`SUPER`)."""
    return _flow_graph(_layered(scenario))


SUPER = (_SRC, _SNK)


def max_flow_value(scenario: Scenario) -> int:
    """Single-commodity maximum flow: exact with one data node, an upper bound otherwise.

    Each data node's source and sink sides are both capped by its capacity
    (a unit that leaves d also comes back to d), which is still a relaxation.
    """
    return int(nx.maximum_flow_value(_flow_graph(_layered(scenario)), _SRC, _SNK))


def _result(scenario: Scenario, policy: str, seed: int, paths: list[tuple[str, tuple[str, ...]]],
            **kw) -> RoutingResult:
    flows = [Flow(d, p, path_cost(scenario, d, p)) for d, p in sorted(paths)]
    return RoutingResult(scenario.name, policy, seed, flows, **kw)


# --------------------------------------------------------------------- optimal


def optimal_routing(scenario: Scenario, seed: int = 0, flow_value: int | None = None) -> RoutingResult:
    """Maximum flow at minimum total cost (see the module docstring).

    With `flow_value`, the cheapest routing of min(flow_value, maximum) flows
    instead, e.g. to compare with a policy that routed fewer flows.
    """
    lay = _layered(scenario)
    if flow_value is not None and flow_value < 0:
        raise ValueError(f"flow_value must be non-negative, got {flow_value}")
    if len(lay.data) == 1:
        return _result(scenario, "optimal", seed, _single_commodity(lay, flow_value))
    paths, extra = _multi_commodity(lay, flow_value)
    return _result(scenario, "optimal", seed, paths, extra=extra)


def _single_commodity(lay: _Layered, limit: int | None) -> list[tuple[str, tuple[str, ...]]]:
    (d,) = lay.data
    flow = nx.max_flow_min_cost(_flow_graph(lay, limit), _SRC, _SNK, capacity="capacity", weight="weight")
    rem = {u: {v: f for v, f in nbrs.items() if f > 0} for u, nbrs in flow.items()}
    paths = []
    for _ in range(flow[_SRC].get(("src", d), 0)):
        node, path = ("src", d), []
        while node != ("snk", d):  # conservation guarantees a way on; smallest id first
            nxt = min(rem[node])
            rem[node][nxt] -= 1
            if not rem[node][nxt]:
                del rem[node][nxt]
            if nxt[0] == "in":
                path.append(nxt[1])
            node = nxt
        paths.append((d, tuple(path)))
    return paths


def _relevant_relays(lay: _Layered, d: str, prev: dict[str, list[str]]) -> set[str]:
    """Relays on at least one route d -> stage 0 -> ... -> stage S-1 -> d."""
    def closure(start: set[str], step) -> set[str]:
        seen, frontier = set(start), set(start)
        while frontier:
            frontier = {b for a in frontier for b in step(a)} - seen
            seen |= frontier
        return seen

    fwd = closure({r for r, _ in lay.first[d]}, lambda a: (b for b, _ in lay.nxt[a]))
    bwd = closure({r for r, _ in lay.last[d]}, lambda b: prev[b])
    return fwd & bwd


def _multi_commodity(lay: _Layered, limit: int | None):
    prev: dict[str, list[str]] = defaultdict(list)
    for a in lay.relay_cap:
        for b, _ in lay.nxt[a]:
            prev[b].append(a)
    # Variables: one per (commodity, oriented link); nodes are ("src", d), ("r", id), ("snk", d).
    var: list[tuple[int, tuple, tuple, float]] = []
    for k, d in enumerate(lay.data):
        rel = _relevant_relays(lay, d, prev)
        var += [(k, ("src", d), ("r", r), c) for r, c in lay.first[d] if r in rel]
        var += [(k, ("r", a), ("r", b), c) for a in sorted(rel) for b, c in lay.nxt[a] if b in rel]
        var += [(k, ("r", r), ("snk", d), c) for r, c in lay.last[d] if r in rel]
    n = len(var)
    eq_rows: dict[tuple[int, str], int] = {}
    ub_rows: dict[tuple[str, str], int] = {}
    eq, ub = [], []  # (row, col, value)
    is_src = np.zeros(n)
    for j, (k, u, v, _) in enumerate(var):
        if u[0] == "src":
            is_src[j] = 1.0
            ub.append((ub_rows.setdefault(("d", u[1]), len(ub_rows)), j, 1.0))
        else:
            eq.append((eq_rows.setdefault((k, u[1]), len(eq_rows)), j, -1.0))
        if v[0] == "r":
            eq.append((eq_rows.setdefault((k, v[1]), len(eq_rows)), j, 1.0))
            ub.append((ub_rows.setdefault(("r", v[1]), len(ub_rows)), j, 1.0))
    b_ub = [lay.data_cap[name] if kind == "d" else lay.relay_cap[name] for kind, name in ub_rows]
    upper = single = int(nx.maximum_flow_value(_flow_graph(lay), _SRC, _SNK))
    if limit is not None:
        upper = min(upper, limit)
    extra = {"single_commodity_max_flow": single}
    if n == 0 or upper == 0:
        return [], dict(extra, lp_max_flow=0.0, lp_bound_total_cost=0.0, lp_bound_mean_cost=0.0,
                        lp_integral=True, integral_method="lp")

    def sparse(entries, rows):
        r, c, v = zip(*entries)
        return csr_matrix((v, (r, c)), shape=(rows, n))

    a_eq = sparse(eq, len(eq_rows)) if eq_rows else None
    b_eq = np.zeros(len(eq_rows)) if eq_rows else None
    a_ub = sparse(ub, len(ub_rows))
    total = sparse([(0, j, 1.0) for j in np.flatnonzero(is_src)], 1)
    # Phase 1: the largest total flow (at most `upper`: the relaxation bound, or `limit`).
    p1 = linprog(-is_src, A_ub=vstack([a_ub, total], format="csr"), b_ub=np.append(b_ub, upper),
                 A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if p1.status != 0:
        raise RuntimeError(f"multi-commodity LP (max flow) failed: {p1.message}")
    fmax = max(0.0, -p1.fun)
    if abs(fmax - round(fmax)) <= EPS:
        fmax = float(round(fmax))  # the usual case; keeps phase 2 from shaving off a sliver
    # Phase 2: the cheapest way to carry exactly that much.
    costs = np.array([c for *_, c in var])
    p2 = linprog(costs, A_ub=a_ub, b_ub=b_ub,
                 A_eq=vstack([a_eq, total], format="csr") if a_eq is not None else total,
                 b_eq=np.append(b_eq, fmax) if b_eq is not None else [fmax],
                 bounds=(0, None), method="highs")
    if p2.status != 0:
        raise RuntimeError(f"multi-commodity LP (min cost) failed: {p2.message}")
    x = p2.x
    integral = bool(np.all(np.abs(x - np.round(x)) <= EPS))
    extra.update(lp_max_flow=round(fmax, 9), lp_bound_total_cost=float(p2.fun),
                 lp_bound_mean_cost=float(p2.fun) / fmax if fmax > EPS else 0.0, lp_integral=integral)
    target = int(np.floor(fmax + EPS))
    method = "lp"
    if not integral:  # the exact integral optimum, by branch and bound (HiGHS)
        method, rows = "rounding", [(a_ub, -np.inf, b_ub), (a_eq, 0.0, 0.0)]
        sol = _milp(costs, rows + [(total, target, target)], n)
        if sol is None:  # no integral routing of `target` flows: maximise the flow first
            best = _milp(-is_src, rows + [(total, 0, target)], n)
            if best is not None:
                target = int(round(float(is_src @ best[0])))
                sol = _milp(costs, rows + [(total, target, target)], n)
        if sol is not None:
            x, optimal = sol
            method = "milp" if optimal else "milp-time-limit"
    extra["integral_method"] = method
    return _round_lp(lay, var, x, target), extra


def _milp(c, rows, n: int):
    """(x, proved optimal) of an integer programme over x >= 0, or None without a solution."""
    cons = [LinearConstraint(a, lo, hi) for a, lo, hi in rows if a is not None]
    res = milp(c, constraints=cons, integrality=np.ones(n), bounds=Bounds(0, np.inf),
               options={"time_limit": MILP_TIME_LIMIT_S})
    if res.x is None:
        return None
    return np.round(res.x), res.status == 0


def _round_lp(lay: _Layered, var, x, target: int) -> list[tuple[str, tuple[str, ...]]]:
    """An integral routing of at most `target` flows from LP edge values (exact if they are integral)."""
    out: dict[str, dict[tuple, dict[tuple, float]]] = {d: defaultdict(dict) for d in lay.data}
    for (k, u, v, _), val in zip(var, x):
        if val > EPS:
            out[lay.data[k]][u][v] = float(val)
    used: dict[str, int] = defaultdict(int)
    sent: dict[str, int] = defaultdict(int)
    paths: list[tuple[str, tuple[str, ...]]] = []

    def peel(d: str):
        """Hops of a unit path along edges carrying >= 1 of d's flow, through relays with room."""
        dead: set[tuple] = set()  # nodes with no way on; the state does not change during a search

        def dfs(node, acc):
            if node[0] == "snk":
                return acc
            for v in sorted(out[d][node]):
                if out[d][node][v] < 1 - EPS or v in dead:
                    continue
                if v[0] == "r" and used[v[1]] >= lay.relay_cap[v[1]]:
                    continue
                found = dfs(v, acc + [(node, v)])
                if found is not None:
                    return found
                dead.add(v)
            return None

        return dfs(("src", d), [])

    for d in lay.data:
        while len(paths) < target and sent[d] < lay.data_cap[d]:
            hops = peel(d)
            if hops is None:
                break
            for u, v in hops:
                out[d][u][v] -= 1.0
            _take(d, tuple(v[1] for _, v in hops[:-1]), used, sent, paths)
    progress = True
    while len(paths) < target and progress:  # fractional leftovers: cheapest free route, in turn
        progress = False
        for d in lay.data:
            if len(paths) >= target or sent[d] >= lay.data_cap[d]:
                continue
            best = _cheapest_free_path(lay, d, used)
            if best is not None:
                _take(d, best[1], used, sent, paths)
                progress = True
    return paths


def _take(d: str, path: tuple[str, ...], used, sent, paths) -> None:
    for r in path:
        used[r] += 1
    sent[d] += 1
    paths.append((d, path))


def _cheapest_free_path(lay: _Layered, d: str, used) -> tuple[float, tuple[str, ...]] | None:
    """Cheapest d -> ... -> d route through relays that still have room (ties: smallest path)."""
    room = lambda r: used[r] < lay.relay_cap[r]  # noqa: E731
    best = {r: (c, (r,)) for r, c in lay.first[d] if room(r)}
    for _ in range(lay.stages - 1):
        nb: dict[str, tuple[float, tuple[str, ...]]] = {}
        for a, (c, p) in best.items():
            for b, cb in lay.nxt[a]:
                cand = (c + cb, p + (b,))
                if room(b) and (b not in nb or cand < nb[b]):
                    nb[b] = cand
        best = nb
    ends = [(best[r][0] + c, best[r][1]) for r, c in lay.last[d] if r in best]
    return min(ends) if ends else None


# ----------------------------------------------------------------------- SWARM


def swarm_routing(scenario: Scenario, seed: int = 0) -> RoutingResult:
    """SWARM's greedy next-hop routing (see the module docstring); `seed` is only reported.

    `rounds` counts round-robin turns, `messages` the hops sent (dropped
    microbatches included), `extra["dropped"]` the dropped microbatches.
    """
    lay = _layered(scenario)
    back = {d: dict(lay.last[d]) for d in lay.data}
    used: dict[str, int] = defaultdict(int)
    sent: dict[str, int] = defaultdict(int)
    failures: dict[str, int] = defaultdict(int)
    paths: list[tuple[str, tuple[str, ...]]] = []
    rounds = messages = dropped = 0
    active = [d for d in lay.data if lay.data_cap[d] > 0]
    while active:
        rounds += 1
        for d in list(active):
            path: list[str] = []
            options = lay.first[d]
            for _ in range(lay.stages):
                free = [(c, r) for r, c in options if used[r] < lay.relay_cap[r]]
                if not free:
                    break
                _, r = min(free)
                messages += 1
                used[r] += 1
                path.append(r)
                options = lay.nxt[r]
            if len(path) == lay.stages and path[-1] in back[d]:
                messages += 1  # the hop back to the data node
                paths.append((d, tuple(path)))
                sent[d] += 1
                failures[d] = 0
            else:
                dropped += 1
                failures[d] += 1
                for r in path:
                    used[r] -= 1
            if sent[d] >= lay.data_cap[d] or failures[d] >= SWARM_MAX_FAILURES:
                active.remove(d)
    return _result(scenario, "swarm", seed, paths, rounds=rounds, converged_round=rounds,
                   messages=messages, extra={"dropped": dropped})
