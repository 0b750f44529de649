"""How good the optimum can be: a proved bound from the LP relaxation, and the exact optimum by MILP.

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
runs it on a sample (docs/bench_join_exact.md).  The bottleneck indicator
matters: without it the MILP is valid but loose (an assignment routing fewer
units than its max flow is cheaper per B*C/F^2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix, csc_matrix, hstack, vstack

from .evaluation import BATCH_MICROBATCHES, FlowModel
from .instances import JoinInstance
from .policies import policy_gwtf


@dataclass(frozen=True)
class OptimumBound:
    cost: float  # no assignment has a lower cost
    flow: int  # the flow value where the bound is attained
    flows_checked: int  # LPs solved (one per possible max flow)


def optimum_bound(inst: JoinInstance, model: FlowModel | None = None) -> OptimumBound:
    """A proved lower bound on the optimal cost (so an upper bound on the optimal improvement).

    An assignment a with max flow F_a costs B * C_a(F_a) / F_a^2, F_a is an
    integer between F_now (candidates only add capacity) and the largest value
    the relaxation can carry, and some stage of a has capacity exactly F_a.  So
    C_a(F_a) >= min over stages s of LB(F_a, s) (`FlowModel.relaxed_min_cost`
    with s the bottleneck) >= LB(F_a) (no bottleneck asked), and the bound is
    min over F of B * min_s LB(F, s) / F^2.  The S LPs of a value F are solved
    lazily: values in increasing order of the plain B * LB(F) / F^2, until that
    is no lower than the best tightened value found.
    """
    model = model or FlowModel(inst)
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


def milp_optimum(inst: JoinInstance, model: FlowModel | None = None, incumbent: tuple[int, ...] | None = None,
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
    from scipy.optimize import milp

    model = model or FlowModel(inst)
    if incumbent is None:
        incumbent = policy_gwtf(inst, model)
    p = _milp_problem(inst, model)
    m, nc, s_count = len(model.edges), len(inst.candidates), inst.stages
    best = tuple(incumbent)
    best_cost = model.evaluate(best).cost
    bound, solves = -math.inf, 0
    for _ in range(rounds):
        lam = best_cost / BATCH_MICROBATCHES
        c = np.concatenate([model.e_cost, np.zeros(p.nx), -lam * p.ks ** 2, np.zeros(s_count)])
        res = milp(c, constraints=p.constraints, integrality=p.integrality, bounds=p.bounds,
                   options={"time_limit": time_limit, "disp": False})
        solves += 1
        dual = getattr(res, "mip_dual_bound", None)
        if dual is None or not math.isfinite(dual):
            dual = -math.inf
        bound = max(bound, BATCH_MICROBATCHES * (lam + min(dual, 0.0) / p.f_lo ** 2))
        if res.x is None or res.fun >= -1e-6:
            break
        x = res.x[m:m + p.nx].reshape(nc, s_count)
        cand = tuple(int(np.argmax(x[k])) for k in range(nc))
        cost = model.evaluate(cand).cost
        if cost >= best_cost - 1e-9:
            break
        best, best_cost = cand, cost
    bound = min(bound, best_cost)
    return MilpResult(best, best_cost, bound, best_cost - bound <= 1e-6 * max(1.0, best_cost), solves)


@dataclass(frozen=True)
class _MilpProblem:
    """The constraints of `milp_optimum`'s MILP (its objective depends on lam).  The variables, in order: the
    edge flows, x[v, s] (`nx` of them), the one-hot z_k of F = ks[k], the bottleneck indicators b_s."""
    ks: np.ndarray  # the possible max flows F: from f_lo to the largest one the relaxation can carry
    f_lo: int  # F_now: candidates only add capacity
    nx: int
    constraints: Any  # scipy.optimize.LinearConstraint
    integrality: np.ndarray
    bounds: Any  # scipy.optimize.Bounds


def _milp_problem(inst: JoinInstance, model: FlowModel) -> _MilpProblem:
    """The constraint rows and the variables' bounds of the MILP (what each block means: `milp_optimum`)."""
    from scipy.optimize import Bounds, LinearConstraint

    cands, s_count = inst.candidates, inst.stages
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
    return _MilpProblem(ks, f_lo, nx, LinearConstraint(a_all, lo, hi), integrality, Bounds(np.zeros(nv), upper))
