"""The policies that choose the stages of the candidates, and the best assignment found.

The policies (a policy chooses the stages of the 20 candidates):

- `gwtf_paper`: V-B as written.  Periods of up to S candidates: the leader
  floods the utilization query (each stage: flows / capacity), takes the S
  waiting candidates of highest capacity (ties: id) and gives the highest to
  the most utilized stage, the second to the second, and so on; the next
  period sees the capacities added.  Every microbatch crosses every stage, so
  the flows are F everywhere and "most utilized" is "smallest capacity": it
  is blind to link costs.
- `waterfill`: protocol/membership.place:
  highest capacity first, each to the most utilized stage re-evaluated after
  every placement, so several candidates can go to one stage in a period
  (capacity water-filling).  Better than `gwtf_paper` when one stage is far
  behind (setting 5*).
- `gwtf` (ours): the leader's stage search (protocol/placement.search_stages)
  from `gwtf_paper` and `waterfill`, given the whole layered cost graph: each
  node's link costs to the next stage and the candidates' links.  It
  evaluates `cost` exactly (here with a HiGHS LP: the flow polytope is totally
  unimodular; the protocol's pure-Python min-cost flow gives the same values)
  and moves one candidate to another stage while that lowers `cost` (first
  improvement, candidates in index order, at most GWTF_PASSES passes over the
  20 x (S-1) moves, a few hundred evaluations).  Ties in `cost` go to the
  lower join delay.
  The lesson: the most utilized stage is not always the right place.  Pushing
  F up to the last unit forces the extra microbatches through expensive
  links; the refined assignment often stops the bottleneck lower (e.g. F 106
  instead of 142) and spends the other candidates on stages where their links
  are cheap, which lowers C/F^2 far more.  Never worse than either start.
  `policy_gwtf(lp_starts=True)` adds a third start, the LP relaxation of the
  assignment (optimum.py) rounded at flows around the best one found
  (docs/bench_join_lpstarts.md has its figures and CPU time).
- `leader`: the daemon's leader, run by its own code
  (protocol/membership.place_by_search) on what the daemon reports to it:
  stage capacities and each candidate's cost to each stage, no link costs
  between members; the same search within its evaluation budget.
- `capacity_first`: highest capacity first, dealt over the stages in index
  order (rank r to stage r mod S).  `capacity_first_by_size`: the other
  reading, each to the stage with the fewest nodes (same in settings 1-4).
- `random`: each candidate to a uniformly random stage (seeded).
- `optimal`: the assignment minimizing `cost`.  S^20 assignments are far too
  many (8^20 ~ 1e18), so it is exhaustive only when S^n <= EXHAUSTIVE_LIMIT
  (small test instances: `optimal_method` "exhaustive", exact).  Otherwise
  `optimal_method` is "local-search": the best of the other policies'
  answers, improved by the local search with moves *and* swaps of two
  candidates, up to OPTIMAL_PASSES passes: an assignment, so its improvement
  is a LOWER bound on the optimal one; never below any other policy.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

from ...protocol.membership import INITIAL, Candidate, StageLoad, known_links, place, place_by_search
from ...protocol.messages import UtilizationReport
from ...protocol.placement import DATA, DEFAULT_MAX_EVALUATIONS, Member, PlacementProblem, search_stages
from .evaluation import FlowModel
from .instances import JoinInstance

EXHAUSTIVE_LIMIT = 4096  # largest S^n that `optimal` tries one by one
OPTIMAL_PASSES = 3  # local-search passes (moves and swaps) of `optimal`
GWTF_PASSES = 3  # local-search passes (moves only) of our GWTF


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


def policy_leader(inst: JoinInstance, max_evaluations: int = DEFAULT_MAX_EVALUATIONS,
                  links: bool = True) -> tuple[int, ...]:
    """The daemon's leader, run by its own code (protocol/membership.known_links and place_by_search) on what
    the daemon tells it: each member's capacity and the Eq. 1 costs of its links to its flow neighbours (the
    stages before and after it, the data node at either end: its `UtilizationReport`), each candidate's
    capacity, its cost to each stage and the costs of its links to every node it measured (its `JoinRequest`:
    the members and the other candidates).  `links=False`: no link costs at all (what the leader knew before
    the reports carried them)."""
    caps = inst.stage_caps()
    loads = {s: StageLoad(min(caps), caps[s]) for s in range(inst.stages)}
    cands = [Candidate(v, inst.cand_cap[v], tuple(float(inst.cand_intra[(v, s)]) for s in range(inst.stages)))
             for v in inst.candidates]
    reports, told = {}, {}
    if links:
        for r, s in sorted(inst.relay_stage.items()):
            reports[r] = UtilizationReport(0, s, min(caps), inst.relay_cap[r], True, tuple(
                (n, float(inst.cost(r, n))) for n in inst.neighbours_of_stage(s)))
        everyone = sorted(inst.relay_stage) + [inst.data]
        for v in inst.candidates:
            told[v] = tuple((n, float(inst.cost(v, n))) for n in everyone + [u for u in inst.candidates if u != v])
    members = [Member(r, s, inst.relay_cap[r]) for r, s in sorted(inst.relay_stage.items())]
    index = {c: k for k, c in enumerate(inst.candidates)}
    assign = [0] * len(inst.candidates)
    for c, s, _src in place_by_search(cands, loads, {s: [INITIAL] for s in range(inst.stages)}, reports,
                                      max_evaluations, members=members,
                                      links=known_links(reports, told, (inst.data,))):
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
    """The other reading of the baseline: highest capacity first, each to the stage with the
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


def policy_gwtf(inst: JoinInstance, model: FlowModel | None = None, passes: int = GWTF_PASSES,
                lp_starts: bool = False, max_evaluations: int = 1 << 30) -> tuple[int, ...]:
    """The leader's policy (protocol/placement.search_stages) from the paper's rule and water-filling,
    evaluated with the simulator's LP (exact, like the leader's own min-cost flow, and faster).

    With `lp_starts`: also round the assignment LP relaxation (`FlowModel.relaxed_rounding`) at
    flows around the best one found, refine the best rounding the same way, and keep it if better.
    """
    model = model or FlowModel(inst)
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


def _local_search(inst: JoinInstance, model: FlowModel, start: tuple[int, ...], passes: int,
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


def policy_optimal(inst: JoinInstance, model: FlowModel | None = None,
                   incumbents: tuple[tuple[int, ...], ...] = ()) -> OptimalResult:
    """Exhaustive when S^n <= EXHAUSTIVE_LIMIT, else a local-search upper bound (module docstring)."""
    model = model or FlowModel(inst)
    n, s_count = len(inst.candidates), inst.stages
    rank = lambda a: (model.evaluate(a).cost, inst.join_delay(a), a)  # noqa: E731
    if s_count ** n <= EXHAUSTIVE_LIMIT:
        best = min(itertools.product(range(s_count), repeat=n), key=rank)
        return OptimalResult(tuple(best), "exhaustive", s_count ** n)
    starts = list(incumbents) or [policy_gwtf(inst, model)]
    start = min(dict.fromkeys(starts), key=rank)
    best = _local_search(inst, model, start, OPTIMAL_PASSES, swaps=True)
    return OptimalResult(best, "local-search", len(model._cache))

