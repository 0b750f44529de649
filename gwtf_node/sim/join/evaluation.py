"""The cost of a system after an assignment, B * C / F^2, by one min-cost max-flow LP (HiGHS), and the LP
relaxation of the assignment itself (for the proved bounds of optimum.py).

Routing and cost.  The routing of an assignment is the maximum flow at
minimum total cost (what GWTF's flow algorithm converges to and what
`baselines.optimal_routing` computes): F microbatches in flight, C the sum of
their path costs.  With complete links between consecutive stages, F is the
smallest stage capacity (every cut must cut a whole stage).  The cost of a
system is the time to push a batch of B = BATCH_MICROBATCHES microbatches:

    cost = (B / F) rounds x (C / F) mean path cost per round = B * C / F^2

(equivalently B over the throughput F^2 / C that Little's law gives for F
microbatches in flight with mean latency C / F).  More flow and cheaper
flow both lower it; B cancels in improvement = (cost_now - cost_after) /
cost_now, which is what Figure 5 plots.

Intra-stage costs.  We read them as the cost for a node to talk to its own
stage: on joining, the download of the stage's weights and optimizer state
from a stage peer (V-B), later the within-stage aggregation.  They do not
enter the routing, so they are not in `cost` (the steady-state figure of
Figure 5).  Each policy reports `join_delay`, the largest intra-stage cost
among the newcomers (downloads run in parallel; the new routing is usable
when the slowest has its state), and our GWTF uses it to break ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csc_matrix, hstack, vstack

from .instances import JoinInstance

BATCH_MICROBATCHES = 100  # B of the cost; it cancels in the improvement


@dataclass(frozen=True)
class Evaluation:
    flow: int  # F: microbatches in flight (maximum flow)
    total_cost: float  # C: sum of their path costs at minimum cost
    cost: float  # B * C / F^2


class FlowModel:
    """The layered graph with a copy of every candidate in every stage, as sparse matrices.

    Graph nodes: 0 = d0 as source, 1 = d0 as sink, then the relays, then the
    copies (v, s).  An assignment keeps the copies (v, assign[v]) and the edges
    whose two ends are kept; the min-cost flow of value F is then one LP.
    """

    def __init__(self, inst: JoinInstance) -> None:
        self.inst = inst
        s_count = inst.stages
        names: list[tuple] = [("src",), ("snk",)]
        stage_of: list[int] = [-1, s_count]
        cap: list[int] = [0, 0]
        for r in sorted(inst.relay_stage):
            names.append(("r", r))
            stage_of.append(inst.relay_stage[r])
            cap.append(inst.relay_cap[r])
        self.n_relays = len(names) - 2
        self.copy_index: dict[tuple[str, int], int] = {}
        for v in inst.candidates:
            for s in range(s_count):
                self.copy_index[(v, s)] = len(names)
                names.append(("c", v, s))
                stage_of.append(s)
                cap.append(inst.cand_cap[v])
        self.names, self.cap = names, np.array(cap, dtype=float)
        by_stage: list[list[int]] = [[] for _ in range(s_count)]
        for i in range(2, len(names)):
            by_stage[stage_of[i]].append(i)

        def machine(i: int) -> str:
            return "d0" if i < 2 else names[i][1]

        edges: list[tuple[int, int, int]] = []
        for b in by_stage[0]:
            edges.append((0, b, inst.cost("d0", machine(b))))
        for s in range(s_count - 1):
            for a in by_stage[s]:
                for b in by_stage[s + 1]:
                    if machine(a) != machine(b):
                        edges.append((a, b, inst.cost(machine(a), machine(b))))
        for a in by_stage[-1]:
            edges.append((a, 1, inst.cost(machine(a), "d0")))
        self.edges = edges
        e_from = np.array([e[0] for e in edges])
        e_to = np.array([e[1] for e in edges])
        self.e_from, self.e_to = e_from, e_to
        self.e_cost = np.array([e[2] for e in edges], dtype=float)
        n, m = len(names), len(edges)
        cols = np.arange(m)
        # Conservation rows (one per graph node >= 2): inflow - outflow = 0.
        inc = coo_matrix((np.ones(m), (e_to, cols)), shape=(n, m))
        out = coo_matrix((np.ones(m), (e_from, cols)), shape=(n, m))
        self.A_in = csc_matrix(inc)[2:]  # capacity rows: inflow <= cap
        self.A_cons = csc_matrix(inc - out)[2:]
        self.A_src = csc_matrix(out)[0:1]
        self.is_copy = np.zeros(n, dtype=bool)
        self.is_copy[2 + self.n_relays:] = True
        self._cache: dict[tuple[int, ...], Evaluation] = {}
        self._relaxed: dict[tuple[int, int | None], float] = {}
        self._relaxed_lp: tuple | None = None
        self._relaxed_x: dict[tuple[int, int | None], np.ndarray] = {}

    def active_nodes(self, assign: tuple[int, ...]) -> np.ndarray:
        keep = ~self.is_copy.copy()
        for v, s in zip(self.inst.candidates, assign):
            keep[self.copy_index[(v, s)]] = True
        return keep

    def min_cost(self, keep: np.ndarray, value: int, cap: np.ndarray | None = None) -> float:
        """Least total cost of `value` units through the kept nodes (LP; integral by total unimodularity)."""
        cap = self.cap if cap is None else cap
        cols = np.flatnonzero(keep[self.e_from] & keep[self.e_to])
        rows = np.flatnonzero(keep[2:])
        a_in = self.A_in[:, cols][rows]
        a_eq = vstack([self.A_cons[:, cols][rows], self.A_src[:, cols]], format="csr")
        b_eq = np.zeros(len(rows) + 1)
        b_eq[-1] = value
        res = linprog(self.e_cost[cols], A_ub=a_in, b_ub=cap[2:][rows], A_eq=a_eq, b_eq=b_eq,
                      bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"{self.inst.name}: no routing of {value} units ({res.message})")
        return float(round(res.fun))

    def relaxed_min_cost(self, value: int, bottleneck: int | None = None) -> float:
        """A lower bound on the total cost of routing `value` units over EVERY assignment.

        The LP relaxation of the assignment: x[v, s] in [0, 1] with sum_s x[v, s] = 1 (a
        candidate may be spread over the stages), the copy (v, s) carrying at most
        cap_v * x[v, s]; edge flows as in `min_cost`.  Every assignment is the integral
        point x[v, s] = [s == assign[v]], so its cost of `value` units is >= this.
        With `bottleneck` = s it also asks stage s to be a bottleneck at `value`
        (relay capacity + sum_v cap_v x[v, s] <= value): an assignment whose max
        flow is `value` has such a stage, so the minimum over s is a tighter bound
        on the assignments with exactly that max flow.
        Returns inf when even the relaxation cannot carry `value` units.
        """
        hit = self._relaxed.get((value, bottleneck))
        if hit is not None:
            return hit
        if self._relaxed_lp is None:
            cands, s_count = self.inst.candidates, self.inst.stages
            m, rows, nx = len(self.edges), self.A_in.shape[0], len(cands) * s_count
            r_idx = np.array([self.copy_index[(v, s)] - 2 for v in cands for s in range(s_count)], dtype=int)
            c_idx = np.arange(nx)
            x_cap = coo_matrix((-self.cap[2:][r_idx], (r_idx, c_idx)), shape=(rows, nx))
            stage_x = coo_matrix((self.cap[2:][r_idx], (np.tile(np.arange(s_count), len(cands)), c_idx)),
                                 shape=(s_count, nx))  # candidate capacity added to each stage
            a_ub = vstack([hstack([self.A_in, x_cap]), hstack([csc_matrix((s_count, m)), stage_x])]).tocsr()
            b_ub = np.concatenate([self.cap[2:], np.full(s_count, float(sum(self.inst.cand_cap.values())))])
            b_ub[r_idx] = 0.0
            one = coo_matrix((np.ones(nx), (np.repeat(np.arange(len(cands)), s_count), c_idx)),
                             shape=(len(cands), nx))
            a_eq = vstack([hstack([self.A_cons, csc_matrix((rows, nx))]),
                           hstack([self.A_src, csc_matrix((1, nx))]),
                           hstack([csc_matrix((len(cands), m)), one])]).tocsr()
            c = np.concatenate([self.e_cost, np.zeros(nx)])
            bounds = [(0, None)] * m + [(0, 1)] * nx
            self._relaxed_lp = (c, a_ub, b_ub, a_eq, rows, len(cands), bounds)
        c, a_ub, b_ub, a_eq, rows, n_c, bounds = self._relaxed_lp
        if bottleneck is not None:
            room = value - self.inst.stage_caps()[bottleneck]
            if room < 0:  # the stage's relays alone exceed `value`: it cannot be the bottleneck
                self._relaxed[(value, bottleneck)] = math.inf
                return math.inf
            b_ub = b_ub.copy()
            b_ub[rows + bottleneck] = room
        b_eq = np.concatenate([np.zeros(rows), [value], np.ones(n_c)])
        res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
        out = float(res.fun) if res.status == 0 else math.inf
        self._relaxed[(value, bottleneck)] = out
        if res.status == 0:
            self._relaxed_x[(value, bottleneck)] = res.x[len(self.edges):].reshape(n_c, self.inst.stages)
        return out

    def relaxed_rounding(self, value: int) -> tuple[int, ...] | None:
        """The relaxation's fractional assignment at `value`, each candidate to its largest x[v, s]."""
        if self.relaxed_min_cost(value) == math.inf:
            return None
        return tuple(int(np.argmax(row)) for row in self._relaxed_x[(value, None)])

    def evaluate(self, assign: tuple[int, ...]) -> Evaluation:
        assign = tuple(assign)
        hit = self._cache.get(assign)
        if hit is None:
            f = min(self.inst.stage_caps(assign))
            c = self.min_cost(self.active_nodes(assign), f) if f > 0 else 0.0
            hit = Evaluation(f, c, BATCH_MICROBATCHES * c / f ** 2 if f > 0 else math.inf)
            self._cache[assign] = hit
        return hit


def stage_flows(inst: JoinInstance, assign: tuple[int, ...] = ()) -> list[int]:
    """Flows through each stage in the max-flow routing: every microbatch crosses every stage."""
    return [min(inst.stage_caps(assign))] * inst.stages

