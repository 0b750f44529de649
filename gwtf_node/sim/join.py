"""`gwtf-node sim join`: the node-addition experiment (section V-B, Table IV, Figure 5 of GWTF).

The system.  One data node d0 and 96 relays (97 nodes) spread over S stages,
plus 20 candidates waiting to join (the paper's "97 nodes" are the running
system: (N-1)/S relays per stage is 12 for S = 8 and 8 for S = 12; the 20
candidates come on top).  Per Table IV, every number is floor(U(lo, hi)):

| setting | S  | capacity | inter-stage cost | intra-stage cost      | relays per stage |
|---------|----|----------|------------------|-----------------------|------------------|
| 1       | 8  | U(1,20)  | U(1,100)         | phi + U(50,100)       | 12               |
| 2       | 8  | U(1,20)  | U(20,100)        | phi + U(50,100)       | 12               |
| 3       | 8  | U(1,5)   | U(1,100)         | phi + U(50,100)       | 12               |
| 4       | 12 | U(1,20)  | U(1,100)         | phi + U(50,100)       | 8                |
| 5*      | 8  | U(1,20)  | U(1,100)         | phi + U(50,100)       | random, >= 1 each    |

Every relay links to every relay of the next stage, d0 to every relay of the
first and the last stage (as in the flow tests).  A link is one physical pair
of machines, so its cost is drawn once: a candidate has one cost to every
existing node and to every other candidate, and uses those of its stage's
neighbours (stages s-1 and s+1, d0 at the ends) wherever it is placed; that
is what "each node knows its costs for each stage" means.  phi (Table IV) is
the largest inter-stage cost of a node for the stage it is in or proposed for;
its intra-stage cost for that stage is phi + floor(U(50,100)).  The data node's
capacity is the total capacity of everyone: it is never the bottleneck.

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

How the paper's experiment is read (line ~179 of the paper, V-B, Table IV).

- Who joins.  "Iteratively, 20 nodes are added" and the issue's "20
  candidates added": all 20 candidates join under every policy, and a policy
  only chooses their stages.  The paper never mentions a larger pool from
  which some are left out (a pool would let "random nodes" pick weak ones and
  explain its random << capacity-first, but its size would be ours to invent,
  and it would decide the ratios): no pool.
- Rounds of S.  "each combination of S candidate nodes added to each of the
  S stages", "every permutation of candidates" and V-B's "the candidate with
  the highest capacity will be added to the stage with highest utilization,
  the second highest to the stage with second highest, and so on" describe
  the same step: a period adds up to S candidates, one per stage, and the next
  period sees the new utilization.  20 candidates are periods of 8, 8, 4 (S = 8)
  or 12, 8 (S = 12).  This shapes the two rules that follow the paper's text
  (`gwtf_paper`, `capacity_first`).  The final cost depends on the final
  assignment only, so for the other policies the rounds change nothing.
- The optimum.  The paper enumerates, per round, the permutations of the
  round's candidates over the stages; the issue asks for "every assignment of
  candidates to stages".  We take the issue's: S^20 assignments, a superset
  of the paper's (per-round permutations chained greedily), so our optimum is
  at least the paper's and the targets are, if anything, harder.
- The baselines.  "Adding highest capacity first" names the order of the
  candidates, not their stages; the stage choice is what GWTF adds (the
  utilization query).  So the baseline takes the candidates by capacity and
  deals them over the stages in index order, one per stage per round: no
  load information.  (It used to go to the stage with the fewest nodes: a
  member count per stage is a load query, a cheap utilization, and with it
  the paper's own rule loses to the baseline in setting 5*, contradicting
  "in all cases GWTF outperforms the two baselines".  It is still reported as
  `capacity_first_by_size`.)  "Adding random nodes": each candidate to a
  uniformly random stage.  A random permutation per round instead would be,
  with equal stages (settings 1-4), statistically the same policy as
  capacity-first dealt in order: the paper's 1.5x vs 3.5x rules that out.
- The cost is not defined in the paper; ours is the issue's example (above).
  The paper's own time per microbatch in Table II (slowest path per
  iteration / microbatches) would need the longest path of a min-sum routing,
  which depends on how the flow is split into paths; the mean path (C / F)
  has no such ambiguity.

The policies (a policy chooses the stages of the 20 candidates):

- `gwtf_paper`: V-B as written.  Periods of up to S candidates: the leader
  floods the utilization query (each stage: flows / capacity), takes the S
  waiting candidates of highest capacity (ties: id) and gives the highest to
  the most utilized stage, the second to the second, and so on; the next
  period sees the capacities added.  Every microbatch crosses every stage, so
  the flows are F everywhere and "most utilized" is "smallest capacity": it
  is blind to link costs.
- `waterfill`: what the runtime leader does (protocol/membership.place):
  highest capacity first, each to the most utilized stage re-evaluated after
  every placement, so several candidates can go to one stage in a period
  (capacity water-filling).  Better than `gwtf_paper` when one stage is far
  behind (setting 5*).
- `gwtf` (ours, what the leader runs): `gwtf_paper` and `waterfill`, each
  refined by marginal gain, and the better of the two.  The flood also
  carries each node's link costs to the next stage (12 numbers per node) and
  the candidates report their measured costs to each stage (issue 5), so the
  leader holds the layered cost graph and evaluates `cost` with a min-cost
  max-flow (HiGHS LP, exact: the flow polytope is totally unimodular).  Local
  search: move one candidate to another stage, keeping any move that lowers
  `cost` (first improvement, candidates in index order, at most GWTF_PASSES
  passes over the 20 x (S-1) moves: a few hundred LPs of ~10 ms per start, a
  few seconds for the leader).  Ties in `cost` go to the lower join delay.
  The lesson: the most utilized stage is not always the right place.  Pushing
  F up to the last unit forces the extra microbatches through expensive
  links; the refined assignment often stops the bottleneck lower (e.g. F 106
  instead of 142) and spends the other candidates on stages where their links
  are cheap, which lowers C/F^2 far more.  Never worse than either start.
  `policy_gwtf(lp_starts=True)` adds a third start, the LP relaxation of the
  assignment (below) rounded at flows around the best one found: better on
  most instances for ~40 % more leader time (docs/bench_join_lpstarts.md);
  not the bench's default, which was measured without it.
- `capacity_first`: highest capacity first, dealt over the stages in index
  order (rank r to stage r mod S).  `capacity_first_by_size`: the previous
  reading, each to the stage with the fewest nodes (same in settings 1-4).
- `random`: each candidate to a uniformly random stage (seeded).
- `optimal`: the assignment minimizing `cost`.  S^20 assignments are far too
  many (8^20 ~ 1e18), so it is exhaustive only when S^n <= EXHAUSTIVE_LIMIT
  (small test instances: `optimal_method` "exhaustive", exact).  Otherwise
  `optimal_method` is "local-search": the best of the other policies'
  answers, improved by the local search with moves *and* swaps of two
  candidates, up to OPTIMAL_PASSES passes: an assignment, so its improvement
  is a LOWER bound on the optimal one; never below any other policy.

How far the true optimum can be (`optimal_bound` in the output).
`optimum_bound` proves an UPPER bound on the optimal improvement: the LP
relaxation of the assignment (a candidate may be spread fractionally over
the stages, sum_s x[v, s] = 1, its copy in s carrying <= cap_v x[v, s]),
solved for every possible max flow F, with the bottleneck stage imposed where
it matters; ~60-500 LPs, 10-20 s an instance, so the bench reports it for
every instance.  The true optimum lies between `optimal` and `optimal_bound`.
`milp_optimum` closes the gap exactly (Dinkelbach iterations of a MILP with
binary assignment, one-hot max flow and bottleneck indicators; exact on the
test instances) but takes minutes per full instance: scripts/join_exact.py
runs it on a sample (docs/bench_join_exact.md).  Dropped on the way: one MILP
per target flow without the bottleneck indicator (valid but loose: an
assignment routing fewer units than its max flow is cheaper per B*C/F^2), and
the bound with every candidate in every stage at once (~30 points loose).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csc_matrix, hstack, vstack

from ..protocol.membership import INITIAL, Candidate, StageLoad, place, place_by_search
from ..protocol.placement import DATA, DEFAULT_MAX_EVALUATIONS, Member, PlacementProblem, search_stages

BATCH_MICROBATCHES = 100  # B of the cost; it cancels in the improvement
CANDIDATES = 20
SYSTEM_NODES = 97  # data node included
EXHAUSTIVE_LIMIT = 4096  # largest S^n that `optimal` tries one by one
OPTIMAL_PASSES = 3  # local-search passes (moves and swaps) of `optimal`
GWTF_PASSES = 3  # local-search passes (moves only) of our GWTF
POLICIES = ("gwtf", "leader", "gwtf_paper", "waterfill", "capacity_first", "capacity_first_by_size", "random", "optimal")
EPS = 1e-9


@dataclass(frozen=True)
class JoinSetting:
    stages: int
    capacity: tuple[int, int]
    inter_cost: tuple[int, int]
    intra_extra: tuple[int, int] = (50, 100)
    random_stage_sizes: bool = False


# Table IV of the paper (top half).
JOIN_SETTINGS: dict[int, JoinSetting] = {
    1: JoinSetting(8, (1, 20), (1, 100)),
    2: JoinSetting(8, (1, 20), (20, 100)),
    3: JoinSetting(8, (1, 5), (1, 100)),
    4: JoinSetting(12, (1, 20), (1, 100)),
    5: JoinSetting(8, (1, 20), (1, 100), random_stage_sizes=True),
}


@dataclass(frozen=True)
class JoinInstance:
    """The running system, the candidates and every link cost (a snapshot the leader could hold)."""

    name: str
    stages: int
    relay_stage: dict[str, int]
    relay_cap: dict[str, int]
    relay_intra: dict[str, int]
    candidates: tuple[str, ...]
    cand_cap: dict[str, int]
    cand_intra: dict[tuple[str, int], int]  # (candidate, stage) -> intra-stage cost there
    link: dict[tuple[str, str], int]  # sorted pair -> cost; d0 is the data node
    data: str = "d0"

    def cost(self, a: str, b: str) -> int:
        return self.link[(a, b) if a < b else (b, a)]

    def stage_members(self, s: int) -> list[str]:
        return sorted(r for r, st in self.relay_stage.items() if st == s)

    def neighbours_of_stage(self, s: int) -> list[str]:
        """Existing nodes adjacent to stage s: stage s-1 (or d0) and s+1 (or d0)."""
        prev = [self.data] if s == 0 else self.stage_members(s - 1)
        nxt = [self.data] if s == self.stages - 1 else self.stage_members(s + 1)
        return sorted(set(prev) | set(nxt))

    def stage_caps(self, assign: tuple[int, ...] = ()) -> list[int]:
        caps = [0] * self.stages
        for r, s in self.relay_stage.items():
            caps[s] += self.relay_cap[r]
        for v, s in zip(self.candidates, assign):
            caps[s] += self.cand_cap[v]
        return caps

    def join_delay(self, assign: tuple[int, ...]) -> int:
        return max((self.cand_intra[(v, s)] for v, s in zip(self.candidates, assign)), default=0)


def _fu(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.floor(rng.uniform(lo, hi)))


def generate_join(setting: int, seed: int, *, relays: int = SYSTEM_NODES - 1,
                  candidates: int = CANDIDATES, stages: int | None = None) -> JoinInstance:
    """The instance of (setting, seed); `relays`, `candidates`, `stages` shrink it for tests."""
    if setting not in JOIN_SETTINGS:
        raise ValueError(f"unknown join setting {setting}: choose one of {sorted(JOIN_SETTINGS)}")
    st = JOIN_SETTINGS[setting]
    s_count = stages if stages is not None else st.stages
    if relays < s_count:
        raise ValueError(f"{relays} relays cannot fill {s_count} stages")
    rng = random.Random(f"join-{setting}-{seed}")
    if st.random_stage_sizes:  # a random composition of `relays` into S positive parts
        cuts = sorted(rng.sample(range(1, relays), s_count - 1))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, relays])]
    else:
        sizes = [relays // s_count + (1 if k < relays % s_count else 0) for k in range(s_count)]
    relay_stage: dict[str, int] = {}
    relay_cap: dict[str, int] = {}
    for s, n in enumerate(sizes):
        for k in range(n):
            rid = f"r{s}_{k}"
            relay_stage[rid] = s
            relay_cap[rid] = _fu(rng, *st.capacity)
    by_stage = [[r for r in relay_stage if relay_stage[r] == s] for s in range(s_count)]
    link: dict[tuple[str, str], int] = {}

    def draw(a: str, b: str) -> None:
        key = (a, b) if a < b else (b, a)
        if key not in link:
            link[key] = _fu(rng, *st.inter_cost)

    for r in by_stage[0] + by_stage[-1]:
        draw("d0", r)
    for s in range(s_count - 1):
        for a in by_stage[s]:
            for b in by_stage[s + 1]:
                draw(a, b)
    cands = tuple(f"c{k:02d}" for k in range(candidates))
    cand_cap = {v: _fu(rng, *st.capacity) for v in cands}
    for v in cands:
        for other in ("d0", *relay_stage):
            draw(v, other)
    for v, w in itertools.combinations(cands, 2):
        draw(v, w)

    def phi(node: str, s: int) -> int:
        prev = ["d0"] if s == 0 else by_stage[s - 1]
        nxt = ["d0"] if s == s_count - 1 else by_stage[s + 1]
        return max(link[(node, o) if node < o else (o, node)] for o in (*prev, *nxt) if o != node)

    relay_intra = {r: phi(r, relay_stage[r]) + _fu(rng, *st.intra_extra) for r in relay_stage}
    cand_intra = {(v, s): phi(v, s) + _fu(rng, *st.intra_extra) for v in cands for s in range(s_count)}
    return JoinInstance(f"join-t{setting}-s{seed}", s_count, relay_stage, relay_cap, relay_intra, cands,
                        cand_cap, cand_intra, link)


def to_scenario(inst: JoinInstance, assign: tuple[int, ...] = ()) -> dict:
    """The system after `assign`, in the scenario file format (specs/scenario.md), to replay or cross-check.

    Only the links a microbatch can use are written; intra-stage costs have no
    place in that format and are left out.
    """
    stage = dict(inst.relay_stage)
    stage.update({v: s for v, s in zip(inst.candidates, assign)})
    cap = dict(inst.relay_cap)
    cap.update(inst.cand_cap)
    nodes = [{"id": inst.data, "role": "data", "capacity": sum(cap.values())}]
    nodes += [{"id": r, "role": "relay", "stage": stage[r], "capacity": cap[r]} for r in sorted(stage)]
    by_stage = [sorted(r for r in stage if stage[r] == s) for s in range(inst.stages)]
    links = [{"a": inst.data, "b": r, "cost": inst.cost(inst.data, r)} for r in by_stage[0]]
    for s in range(inst.stages - 1):
        links += [{"a": a, "b": b, "cost": inst.cost(a, b)} for a in by_stage[s] for b in by_stage[s + 1]]
    links += [{"a": r, "b": inst.data, "cost": inst.cost(r, inst.data)} for r in by_stage[-1]
              if inst.stages > 1]
    return {"name": inst.name, "stages": inst.stages, "nodes": nodes, "links": links}


# ------------------------------------------------------------------ evaluation


@dataclass(frozen=True)
class Evaluation:
    flow: int  # F: microbatches in flight (maximum flow)
    total_cost: float  # C: sum of their path costs at minimum cost
    cost: float  # B * C / F^2


class _FlowModel:
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


# -------------------------------------------------------------------- policies


def _by_capacity(inst: JoinInstance) -> list[int]:
    return sorted(range(len(inst.candidates)), key=lambda k: (-inst.cand_cap[inst.candidates[k]], k))


def policy_gwtf_paper(inst: JoinInstance) -> tuple[int, ...]:
    """V-B as written: periods of up to S candidates, rank-matched to the stages by utilization.

    Each period the leader floods the utilization query, takes the S waiting
    candidates of highest capacity (ties: id) and gives the highest to the most
    utilized stage, the second to the second, and so on (one per stage); the
    next period sees the capacities the previous one added.
    """
    caps = inst.stage_caps()
    order = _by_capacity(inst)
    assign = [0] * len(inst.candidates)
    for start in range(0, len(order), inst.stages):
        flows = [min(caps)] * inst.stages  # the flood: every microbatch crosses every stage (stage_flows)
        ranked = sorted(range(inst.stages), key=lambda t: (-(flows[t] / caps[t] if caps[t] else math.inf), t))
        for k, s in zip(order[start:start + inst.stages], ranked):
            assign[k] = s
            caps[s] += inst.cand_cap[inst.candidates[k]]
    return tuple(assign)


def policy_waterfill(inst: JoinInstance) -> tuple[int, ...]:
    """The runtime leader's rule, run by its own code (protocol/membership.place): highest capacity first, each
    to the stage of highest utilization re-evaluated after every placement (capacity water-filling).  The flood
    reports the max flow F at every stage; candidates report no cost preference (all stages alike)."""
    caps = inst.stage_caps()
    f = min(caps)
    loads = {s: StageLoad(f, caps[s]) for s in range(inst.stages)}
    cands = [Candidate(c, inst.cand_cap[c], (0.0,) * inst.stages) for c in inst.candidates]
    index = {c: k for k, c in enumerate(inst.candidates)}
    assign = [0] * len(inst.candidates)
    for c, s, _src in place(cands, loads, {s: [INITIAL] for s in range(inst.stages)}, {}):
        assign[index[c.node]] = s
    return tuple(assign)


def policy_leader(inst: JoinInstance, max_evaluations: int = DEFAULT_MAX_EVALUATIONS) -> tuple[int, ...]:
    """The daemon's leader, run by its own code (protocol/membership.place_by_search) on what the daemon tells
    it: each stage's capacity, the max flow F at every stage, each candidate's capacity and its cost to each
    stage (its intra-stage cost there); no link costs between members."""
    caps = inst.stage_caps()
    loads = {s: StageLoad(min(caps), caps[s]) for s in range(inst.stages)}
    cands = [Candidate(v, inst.cand_cap[v], tuple(float(inst.cand_intra[(v, s)]) for s in range(inst.stages)))
             for v in inst.candidates]
    index = {c: k for k, c in enumerate(inst.candidates)}
    assign = [0] * len(inst.candidates)
    for c, s, _src in place_by_search(cands, loads, {s: [INITIAL] for s in range(inst.stages)}, {},
                                      max_evaluations):
        assign[index[c.node]] = s
    return tuple(assign)


def policy_capacity_first(inst: JoinInstance) -> tuple[int, ...]:
    """The paper's baseline "adding highest capacity first": candidates by capacity, highest first
    (ties: id), dealt to the stages in index order, one per stage per round of S (module docstring)."""
    assign = [0] * len(inst.candidates)
    for rank, k in enumerate(_by_capacity(inst)):
        assign[k] = rank % inst.stages
    return tuple(assign)


def policy_capacity_first_by_size(inst: JoinInstance) -> tuple[int, ...]:
    """The previous reading of the baseline: highest capacity first, each to the stage with the
    fewest nodes (ties: lowest index).  Same as `policy_capacity_first` when the stages are equal."""
    count = [len(inst.stage_members(s)) for s in range(inst.stages)]
    assign = [0] * len(inst.candidates)
    for k in _by_capacity(inst):
        s = min(range(inst.stages), key=lambda t: (count[t], t))
        assign[k] = s
        count[s] += 1
    return tuple(assign)


def policy_random(inst: JoinInstance, seed: int) -> tuple[int, ...]:
    rng = random.Random(f"join-random-{inst.name}-{seed}")
    return tuple(rng.randrange(inst.stages) for _ in inst.candidates)


LP_START_OFFSETS = (-6, -3, 0, 3, 6)  # flows around the local search's, for `lp_starts`


def placement_problem(inst: JoinInstance) -> PlacementProblem:
    """The leader's snapshot of `inst`: every relay and link, each candidate's intra-stage cost per stage
    (its join delay there)."""
    members = tuple(Member(r, inst.relay_stage[r], inst.relay_cap[r]) for r in sorted(inst.relay_stage))
    cands = tuple(Candidate(v, inst.cand_cap[v], tuple(float(inst.cand_intra[(v, s)]) for s in range(inst.stages)))
                  for v in inst.candidates)
    rename = {inst.data: DATA}
    links = {}
    for (a, b), c in inst.link.items():
        a, b = rename.get(a, a), rename.get(b, b)
        links[(a, b) if a < b else (b, a)] = float(c)
    return PlacementProblem(inst.stages, members, cands, links)


def policy_gwtf(inst: JoinInstance, model: _FlowModel | None = None, passes: int = GWTF_PASSES,
                lp_starts: bool = False, max_evaluations: int = 1 << 30) -> tuple[int, ...]:
    """The leader's policy (protocol/placement.search_stages) from the paper's rule and water-filling,
    evaluated with the simulator's LP (exact, like the leader's own min-cost flow, and faster).

    With `lp_starts`: also round the assignment LP relaxation (`_FlowModel.relaxed_rounding`) at
    flows around the best one found, refine the best rounding the same way, and keep it if better.
    """
    model = model or _FlowModel(inst)
    problem = placement_problem(inst)
    objective = lambda a: model.evaluate(a).cost  # noqa: E731
    best = search_stages(problem, (policy_gwtf_paper(inst), policy_waterfill(inst)), objective=objective,
                         max_evaluations=max_evaluations, passes=passes)
    if lp_starts:
        rank = lambda a: (round(model.evaluate(a).cost, 9), inst.join_delay(a), a)  # noqa: E731
        f = model.evaluate(best).flow
        rounded = [a for d in LP_START_OFFSETS if (a := model.relaxed_rounding(f + d)) is not None]
        if rounded:
            refined = search_stages(problem, (min(rounded, key=rank),), objective=objective,
                                    max_evaluations=max_evaluations, passes=passes)
            best = min(best, refined, key=rank)
    return best


@dataclass
class OptimalResult:
    assign: tuple[int, ...]
    method: str  # "exhaustive" (exact) or "local-search" (an upper bound on the optimal cost)
    evaluations: int  # assignments evaluated with the min-cost flow


def _local_search(inst: JoinInstance, model: _FlowModel, start: tuple[int, ...], passes: int,
                  swaps: bool) -> tuple[int, ...]:
    """Move one candidate to another stage (and, with `swaps`, swap the stages of two
    candidates), keeping every change that lowers (cost, join delay): first improvement,
    candidates in index order, at most `passes` passes over all changes."""
    cur = list(start)

    def key(a) -> tuple[float, int]:
        return (round(model.evaluate(tuple(a)).cost, 9), inst.join_delay(tuple(a)))

    best = key(cur)
    n = len(cur)
    options = [(k, s) for k in range(n) for s in range(inst.stages)]
    if swaps:
        options += [(k, -1 - j) for k, j in itertools.combinations(range(n), 2)]
    for _ in range(passes):
        improved = False
        for k, op in options:
            trial = list(cur)
            if op >= 0:
                if op == cur[k]:
                    continue
                trial[k] = op
            else:
                j = -1 - op
                if cur[k] == cur[j]:
                    continue
                trial[k], trial[j] = cur[j], cur[k]
            kt = key(trial)
            if kt < best:
                cur, best, improved = trial, kt, True
        if not improved:
            break
    return tuple(cur)


def policy_optimal(inst: JoinInstance, model: _FlowModel | None = None,
                   incumbents: tuple[tuple[int, ...], ...] = ()) -> OptimalResult:
    """Exhaustive when S^n <= EXHAUSTIVE_LIMIT, else a local-search upper bound (module docstring)."""
    model = model or _FlowModel(inst)
    n, s_count = len(inst.candidates), inst.stages
    rank = lambda a: (model.evaluate(a).cost, inst.join_delay(a), a)  # noqa: E731
    if s_count ** n <= EXHAUSTIVE_LIMIT:
        best = min(itertools.product(range(s_count), repeat=n), key=rank)
        return OptimalResult(tuple(best), "exhaustive", s_count ** n)
    starts = list(incumbents) or [policy_gwtf(inst, model)]
    start = min(dict.fromkeys(starts), key=rank)
    best = _local_search(inst, model, start, OPTIMAL_PASSES, swaps=True)
    return OptimalResult(best, "local-search", len(model._cache))


@dataclass(frozen=True)
class OptimumBound:
    cost: float  # no assignment has a lower cost
    flow: int  # the flow value where the bound is attained
    flows_checked: int  # LPs solved (one per possible max flow)


def optimum_bound(inst: JoinInstance, model: _FlowModel | None = None) -> OptimumBound:
    """A proved lower bound on the optimal cost (so an upper bound on the optimal improvement).

    An assignment a with max flow F_a costs B * C_a(F_a) / F_a^2, F_a is an
    integer between F_now (candidates only add capacity) and the largest value
    the relaxation can carry, and some stage of a has capacity exactly F_a.  So
    C_a(F_a) >= min over stages s of LB(F_a, s) (`_FlowModel.relaxed_min_cost`
    with s the bottleneck) >= LB(F_a) (no bottleneck asked), and the bound is
    min over F of B * min_s LB(F, s) / F^2.  The S LPs of a value F are solved
    lazily: values in increasing order of the plain B * LB(F) / F^2, until that
    is no lower than the best tightened value found.
    """
    model = model or _FlowModel(inst)
    f = min(inst.stage_caps())
    plain: dict[int, float] = {}
    while f > 0:
        lb = model.relaxed_min_cost(f)
        if lb == math.inf:
            break
        plain[f] = BATCH_MICROBATCHES * lb / f ** 2
        f += 1
    checked = len(plain) + 1
    best, arg = math.inf, min(inst.stage_caps())
    for f in sorted(plain, key=lambda v: (plain[v], v)):
        if plain[f] >= best:
            break
        vals = []
        for s in range(inst.stages):
            vals.append(model.relaxed_min_cost(f, s))
            checked += 1
        val = BATCH_MICROBATCHES * min(vals) / f ** 2
        if val < best:
            best, arg = val, f
    return OptimumBound(best, arg, checked)


@dataclass(frozen=True)
class MilpResult:
    assign: tuple[int, ...]  # the best assignment known (the incumbent if the MILP found none better)
    cost: float  # its cost
    cost_bound: float  # proved: no assignment costs less
    proven: bool  # cost == cost_bound (to 1e-6): the assignment is optimal
    solves: int  # MILPs solved


def milp_optimum(inst: JoinInstance, model: _FlowModel | None = None, incumbent: tuple[int, ...] | None = None,
                 time_limit: float = 60.0, rounds: int = 4) -> MilpResult:
    """The exact optimum (or a proved bound on it) by mixed-integer programming, Dinkelbach style.

    cost = B * C / F^2 is a ratio, so for a value lam we solve the MILP
        min  C - lam * F^2   over assignments and their routings,
    with binary x[v, s] (sum_s x[v, s] = 1, the copy (v, s) carries <= cap_v x[v, s]),
    F one-hot over its possible integer values (z_k, F = sum k z_k, F^2 = sum k^2 z_k:
    linear), the edge flows routing F units, and a binary bottleneck indicator per
    stage (some stage has capacity <= F, so F is the assignment's max flow and not
    less).  Start with lam = cost(incumbent) / B: a negative optimum is a better
    assignment (take it, lam = its cost / B, solve again); a dual bound D of the
    MILP proves C_a - lam F_a^2 >= D for every a, i.e. cost_a >= B * (lam + D / F_now^2)
    (D <= 0; D = 0 proves the incumbent optimal).  HiGHS stops at `time_limit`
    seconds per solve with its best dual bound, so the bound is valid either way.
    Minutes per full-size instance: a spot check (scripts/join_exact.py), not the bench.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    model = model or _FlowModel(inst)
    cands, s_count = inst.candidates, inst.stages
    if incumbent is None:
        incumbent = policy_gwtf(inst, model)
    m, rows, nc = len(model.edges), model.A_in.shape[0], len(cands)
    nx = nc * s_count
    f_lo = min(inst.stage_caps())
    f_hi = f_lo
    while model.relaxed_min_cost(f_hi + 1) < math.inf:
        f_hi += 1
    ks = np.arange(f_lo, f_hi + 1, dtype=float)
    nz = len(ks)
    nv = m + nx + nz + s_count
    r_idx = np.array([model.copy_index[(v, s)] - 2 for v in cands for s in range(s_count)], dtype=int)
    xc = np.arange(nx)
    capv = np.array([inst.cand_cap[v] for v in cands for _ in range(s_count)], dtype=float)

    def zeros(r: int, c: int) -> csc_matrix:
        return csc_matrix((r, c))

    relay_caps = np.array(inst.stage_caps(), dtype=float)
    big = relay_caps + sum(inst.cand_cap.values()) - f_lo  # makes a non-bottleneck row slack
    blocks = [
        hstack([model.A_in, coo_matrix((-capv, (r_idx, xc)), shape=(rows, nx)), zeros(rows, nz + s_count)]),
        hstack([model.A_cons, zeros(rows, nx + nz + s_count)]),
        hstack([model.A_src, zeros(1, nx), csc_matrix(-ks[None, :]), zeros(1, s_count)]),
        hstack([zeros(1, m + nx), csc_matrix(np.ones((1, nz))), zeros(1, s_count)]),
        hstack([zeros(nc, m), coo_matrix((np.ones(nx), (np.repeat(np.arange(nc), s_count), xc)), shape=(nc, nx)),
                zeros(nc, nz + s_count)]),
        # relay cap_s + sum_v cap_v x[v, s] <= F + big_s (1 - b_s)
        hstack([zeros(s_count, m), coo_matrix((capv, (np.tile(np.arange(s_count), nc), xc)), shape=(s_count, nx)),
                csc_matrix(np.tile(-ks, (s_count, 1))), csc_matrix(np.diag(big))]),
        hstack([zeros(1, m + nx + nz), csc_matrix(np.ones((1, s_count)))]),
    ]
    a_all = vstack(blocks).tocsr()
    cap_rhs = model.cap[2:].copy()
    cap_rhs[r_idx] = 0.0
    lo = np.concatenate([np.full(rows, -np.inf), np.zeros(rows), [0.0, 1.0], np.ones(nc),
                         np.full(s_count, -np.inf), [1.0]])
    hi = np.concatenate([cap_rhs, np.zeros(rows), [0.0, 1.0], np.ones(nc), big - relay_caps, [np.inf]])
    integrality = np.concatenate([np.zeros(m), np.ones(nx + nz + s_count)])
    upper = np.concatenate([np.full(m, np.inf), np.ones(nx + nz + s_count)])
    best = tuple(incumbent)
    best_cost = model.evaluate(best).cost
    bound, solves = -math.inf, 0
    for _ in range(rounds):
        lam = best_cost / BATCH_MICROBATCHES
        c = np.concatenate([model.e_cost, np.zeros(nx), -lam * ks ** 2, np.zeros(s_count)])
        res = milp(c, constraints=LinearConstraint(a_all, lo, hi), integrality=integrality,
                   bounds=Bounds(np.zeros(nv), upper), options={"time_limit": time_limit, "disp": False})
        solves += 1
        dual = getattr(res, "mip_dual_bound", None)
        if dual is None or not math.isfinite(dual):
            dual = -math.inf
        bound = max(bound, BATCH_MICROBATCHES * (lam + min(dual, 0.0) / f_lo ** 2))
        if res.x is None or res.fun >= -1e-6:
            break
        x = res.x[m:m + nx].reshape(nc, s_count)
        cand = tuple(int(np.argmax(x[k])) for k in range(nc))
        cost = model.evaluate(cand).cost
        if cost >= best_cost - 1e-9:
            break
        best, best_cost = cand, cost
    bound = min(bound, best_cost)
    return MilpResult(best, best_cost, bound, best_cost - bound <= 1e-6 * max(1.0, best_cost), solves)


# ------------------------------------------------------------------ experiment


def run_join(setting: int, seed: int, *, instance: JoinInstance | None = None, with_bound: bool = True) -> dict:
    """Every policy on one instance; the JSON object that `sim join --json` prints."""
    inst = instance or generate_join(setting, seed)
    model = _FlowModel(inst)
    now = model.evaluate(())  # no candidate placed: the copies are all dropped
    assigns = {
        "gwtf": policy_gwtf(inst, model),
        "gwtf_paper": policy_gwtf_paper(inst),
        "waterfill": policy_waterfill(inst),
        "leader": policy_leader(inst),
        "capacity_first": policy_capacity_first(inst),
        "capacity_first_by_size": policy_capacity_first_by_size(inst),
        "random": policy_random(inst, seed),
    }
    opt = policy_optimal(inst, model, incumbents=tuple(assigns.values()))
    assigns["optimal"] = opt.assign
    bound = optimum_bound(inst, model) if with_bound else None
    out_policies = {}
    for name in POLICIES:
        a = assigns[name]
        ev = model.evaluate(a)
        out_policies[name] = {
            "flow": ev.flow, "total_cost": ev.total_cost, "cost": round(ev.cost, 6),
            "improvement": round((now.cost - ev.cost) / now.cost, 6),
            "join_delay": inst.join_delay(a),
            "stages": {v: s for v, s in zip(inst.candidates, a)},
        }
    return {
        "scenario": inst.name, "setting": setting, "seed": seed, "stages": inst.stages,
        "nodes": 1 + len(inst.relay_stage), "candidates": len(inst.candidates),
        "batch_microbatches": BATCH_MICROBATCHES,
        "cost_definition": "B*C/F^2: F max flow, C its min total path cost, B microbatches per batch",
        "now": {"flow": now.flow, "total_cost": now.total_cost, "cost": round(now.cost, 6)},
        "policies": out_policies,
        "improvement": {name: out_policies[name]["improvement"] for name in POLICIES},
        "optimal_method": opt.method,
        "optimal_evaluations": opt.evaluations,
        # A proved upper bound on the optimal improvement (`optimum_bound`); None without `with_bound`.
        "optimal_bound": None if bound is None else {
            "cost": round(bound.cost, 6), "flow": bound.flow, "lps": bound.flows_checked,
            "improvement": round((now.cost - bound.cost) / now.cost, 6)},
    }


def summary(res: dict) -> str:
    now = res["now"]
    lines = [
        f"node addition {res['scenario']}: setting {res['setting']} of Table IV, seed {res['seed']}: "
        f"{res['nodes']} nodes in {res['stages']} stages, {res['candidates']} candidates",
        f"cost = B*C/F^2 (B = {res['batch_microbatches']} microbatches, F max flow, C its min total cost)",
        f"now: flow {now['flow']}  total cost {now['total_cost']:g}  cost {now['cost']:.2f}",
        f"{'policy':<15} {'flow':>5} {'total cost':>10} {'cost':>9} {'improvement':>12} {'join delay':>11}",
    ]
    for name, p in res["policies"].items():
        lines.append(f"{name:<15} {p['flow']:>5} {p['total_cost']:>10g} {p['cost']:>9.2f} "
                     f"{100 * p['improvement']:>11.2f}% {p['join_delay']:>11}")
    note = {"exhaustive": "exact, every assignment tried",
            "local-search": "best found by a local search (moves and swaps) from the best other policy: "
                            "an upper bound on the optimal cost, so a lower bound on its improvement"}
    lines.append(f"optimal: {note[res['optimal_method']]}")
    if res.get("optimal_bound"):
        b = res["optimal_bound"]
        lines.append(f"no assignment does better than {100 * b['improvement']:.2f}% (LP relaxation of the "
                     f"assignment, tightest at flow {b['flow']}; {b['lps']} LPs)")
    return "\n".join(lines)


def add_join_parser(simsub, parser_class=None, nonneg_int=int) -> argparse.ArgumentParser:
    """Register `sim join` on the `sim` subcommands (cli.py calls this after `sim flow`)."""
    del parser_class  # `simsub` was made with it: add_parser builds that class
    j = simsub.add_parser("join", help="the node-addition experiment of Table IV / Figure 5")
    j.add_argument("--setting", type=int, choices=range(1, 6), required=True, metavar="{1..5}")
    j.add_argument("--seed", type=nonneg_int, default=0)
    j.add_argument("--json", action="store_true", help="one JSON object; key 'improvement' per policy")
    j.set_defaults(func=cmd_sim_join)
    return j


def cmd_sim_join(args: argparse.Namespace) -> int:
    res = run_join(args.setting, args.seed)
    print(json.dumps(res) if args.json else summary(res))
    return 0
