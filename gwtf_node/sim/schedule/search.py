"""DT-FM's search (section 3.4 of the DT-FM paper): a hybrid genetic algorithm over balanced partitions.

The genome is the group of every free device (`labels`); a pinned group
(GWTF's data nodes) never changes.  Every candidate is a valid partition:
each device in exactly one group and every group of its required size
(`valid`; the crossover repairs sizes, a local-search move is a swap).

Generation (steady state, as the paper and its reference code): two parents
drawn at random; the offspring takes the second parent's labels and five
random devices take the first parent's (the "five-point" crossover of Kang
and Moon, with the first parent's groups renamed to overlap the second's
most, so that a label means the same group in both); sizes repaired by
moving the excess devices of overfull groups, in random order, to underfull
groups; then local search; the offspring replaces the worst member of the
population when it costs less.  The population starts from random
partitions; the search runs a fixed number of generations so that a seed
determines the result.

Local searches (the paper's ablation, `method`):

* `dtfm` (the paper's): for every pair of groups C_j, C_j', the fastest link
  inside each (d1-d2, d1'-d2') gives four swap candidates d_a <-> d'_b,
  scored by GAIN = mean_{d'' in C_j'} w(d_a, d'') - w(d_a, partner) +
  mean_{d'' in C_j} w(d'_b, d'') - w(d'_b, partner'), w the pipeline hop
  cost: what a device's links to its new group cost on average now, minus
  the fast link it is expected to use for pipelining after the swap.  The
  candidates are tried in decreasing gain (positive only) and the first that
  lowers the cost model's COMM-COST is applied; the search stops when none
  does (a move is accepted only on the real objective: the gain orders the
  candidates, it does not decide).
* `kl`: Kernighan-Lin passes between every pair of groups with the classical
  gain D_a + D_b - 2 a(a, b) over affinities a = 1 / w (a cut of slow links):
  in each pass the best swaps are locked in turn and the prefix with the
  largest cumulative gain is applied, blind to the cost model, as the
  textbook algorithm; the genetic algorithm then judges the offspring by
  COMM-COST.
* `random`: DT-FM's "without scheduler" ablation: one random balanced
  assignment, no search.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from .costmodel import CostModel, Costs, Partition

METHODS = ("dtfm", "kl", "random")
CROSSOVER_POINTS = 5
POPULATION = 20
GENERATIONS = 60
LOCAL_TRIES = 8  # dtfm local search: candidates tried (in gain order) before giving up a step


@dataclass(frozen=True)
class Problem:
    """Which devices are free, the sizes of their groups, and the pinned group (index 0 when present)."""

    free: tuple[int, ...]
    sizes: tuple[int, ...]
    pinned: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if sum(self.sizes) != len(self.free):
            raise ValueError(f"{len(self.free)} free devices cannot fill groups of sizes {self.sizes} "
                             f"(they need {sum(self.sizes)})")
        if any(s < 1 for s in self.sizes):
            raise ValueError(f"every group needs at least one device, sizes {self.sizes}")

    def partition(self, labels: dict[int, int]) -> Partition:
        groups: list[list[int]] = [[] for _ in self.sizes]
        for d in self.free:
            groups[labels[d]].append(d)
        out = tuple(tuple(sorted(g)) for g in groups)
        return ((tuple(sorted(self.pinned)),) + out) if self.pinned is not None else out


def valid(problem: Problem, part: Partition) -> bool:
    """Every device in exactly one group, every group of its required size, the pinned group unchanged."""
    free_groups = part[1:] if problem.pinned is not None else part
    if problem.pinned is not None and tuple(sorted(part[0])) != tuple(sorted(problem.pinned)):
        return False
    if tuple(len(g) for g in free_groups) != problem.sizes:
        return False
    seen = [d for g in free_groups for d in g]
    return sorted(seen) == sorted(problem.free) and len(set(seen)) == len(seen)


@dataclass
class SearchResult:
    method: str
    partition: Partition
    costs: Costs
    generations: int
    evaluations: int
    cpu_s: float
    history: list[float] = field(default_factory=list)  # best COMM-COST after each generation
    checked: int = 0  # candidates checked valid (every offspring is)


def random_labels(problem: Problem, rng: random.Random) -> dict[int, int]:
    devices = list(problem.free)
    rng.shuffle(devices)
    labels, k = {}, 0
    for g, s in enumerate(problem.sizes):
        for d in devices[k:k + s]:
            labels[d] = g
        k += s
    return labels


def _align(problem: Problem, p1: dict[int, int], p2: dict[int, int]) -> dict[int, int]:
    """p1's labels renamed to overlap p2's most (only among groups of equal size, so sizes stay right)."""
    k = len(problem.sizes)
    overlap = np.zeros((k, k))
    for d in problem.free:
        overlap[p1[d], p2[d]] += 1
    size = np.asarray(problem.sizes)
    overlap[size[:, None] != size[None, :]] = -1e9
    r, c = linear_sum_assignment(-overlap)
    rename = dict(zip(r.tolist(), c.tolist()))
    return {d: rename[g] for d, g in p1.items()}


def crossover(problem: Problem, p1: dict[int, int], p2: dict[int, int], rng: random.Random) -> dict[int, int]:
    """Five-point crossover with size repair (module docstring)."""
    p1 = _align(problem, p1, p2)
    child = dict(p2)
    free = list(problem.free)
    for d in rng.sample(free, min(CROSSOVER_POINTS, len(free))):
        child[d] = p1[d]
    count = [0] * len(problem.sizes)
    for g in child.values():
        count[g] += 1
    order = free[:]
    rng.shuffle(order)
    for d in order:
        g = child[d]
        if count[g] > problem.sizes[g]:
            to = next(h for h in range(len(problem.sizes)) if count[h] < problem.sizes[h])
            count[g] -= 1
            count[to] += 1
            child[d] = to
    return child


def _fastest_pair(model: CostModel, group: list[int]) -> tuple[int, int]:
    if len(group) < 2:
        return group[0], group[0]
    return min(((a, b) for i, a in enumerate(group) for b in group[i + 1:]),
               key=lambda p: (model.pp_pair_s(*p), p))


def dtfm_local_search(model: CostModel, problem: Problem, labels: dict[int, int]) -> dict[int, int]:
    """The paper's local search (module docstring); returns improved labels."""
    labels = dict(labels)
    cur = model.cost(problem.partition(labels)).total_s
    k = len(problem.sizes)
    while True:
        groups = [[d for d in problem.free if labels[d] == g] for g in range(k)]
        cands = []
        for j in range(k):
            pj = _fastest_pair(model, groups[j])
            for jj in range(j + 1, k):
                pjj = _fastest_pair(model, groups[jj])
                for a in dict.fromkeys(pj):
                    pa = pj[1] if a == pj[0] else pj[0]
                    for b in dict.fromkeys(pjj):
                        pb = pjj[1] if b == pjj[0] else pjj[0]
                        gain = (np.mean([model.pp_pair_s(a, z) for z in groups[jj]]) - model.pp_pair_s(a, pa)
                                + np.mean([model.pp_pair_s(b, z) for z in groups[j]]) - model.pp_pair_s(b, pb))
                        if gain > 0:
                            cands.append((-float(gain), a, b))
        cands.sort()
        moved = False
        for _, a, b in cands[:LOCAL_TRIES]:
            labels[a], labels[b] = labels[b], labels[a]
            c = model.cost(problem.partition(labels)).total_s
            if c < cur - 1e-12:
                cur, moved = c, True
                break
            labels[a], labels[b] = labels[b], labels[a]
        if not moved:
            return labels


def kl_local_search(model: CostModel, problem: Problem, labels: dict[int, int]) -> dict[int, int]:
    """One Kernighan-Lin pass between every pair of groups, over affinities 1 / w (module docstring)."""
    labels = dict(labels)
    k = len(problem.sizes)
    for j in range(k):
        for jj in range(j + 1, k):
            a_side = [d for d in problem.free if labels[d] == j]
            b_side = [d for d in problem.free if labels[d] == jj]
            for x, y in _kl_pass(model, a_side, b_side):
                labels[x], labels[y] = labels[y], labels[x]
    return labels


def _aff(model: CostModel, a: int, b: int) -> float:
    w = model.pp_pair_s(a, b)
    return 1.0 / w if w > 0 else 0.0


def _kl_pass(model: CostModel, side_a: list[int], side_b: list[int]) -> list[tuple[int, int]]:
    a, b = list(side_a), list(side_b)
    members = {d: 0 for d in a} | {d: 1 for d in b}

    def dval(d: int) -> float:
        own = members[d]
        ext = sum(_aff(model, d, z) for z, s in members.items() if s != own)
        inn = sum(_aff(model, d, z) for z, s in members.items() if s == own and z != d)
        return ext - inn

    locked: set[int] = set()
    swaps, gains = [], []
    for _ in range(min(len(a), len(b))):
        D = {d: dval(d) for d in members if d not in locked}
        best = None
        for x in a:
            if x in locked:
                continue
            for y in b:
                if y in locked:
                    continue
                g = D[x] + D[y] - 2 * _aff(model, x, y)
                if best is None or g > best[0]:
                    best = (g, x, y)
        if best is None:
            break
        g, x, y = best
        locked |= {x, y}
        members[x], members[y] = 1, 0  # tentatively swapped for the next gains
        swaps.append((x, y))
        gains.append(g)
    cum = np.cumsum(gains) if gains else np.array([])
    if not len(cum) or cum.max() <= 1e-12:
        return []
    return swaps[:int(np.argmax(cum)) + 1]


def search(model: CostModel, problem: Problem, method: str, rng: random.Random, *,
           population: int = POPULATION, generations: int = GENERATIONS, on_candidate=None) -> SearchResult:
    """DT-FM's scheduler with local search `method` (or one random assignment); `on_candidate(partition)` is
    called with every candidate the search builds (tests check their validity)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: one of {METHODS}")
    start_cpu = time.process_time()
    evals0 = model.evaluations
    checked = 0

    def seen(labels: dict[int, int]) -> None:
        nonlocal checked
        checked += 1
        if on_candidate is not None:
            on_candidate(problem.partition(labels))

    if method == "random":
        labels = random_labels(problem, rng)
        seen(labels)
        part = problem.partition(labels)
        costs = model.cost(part)
        return SearchResult(method, part, costs, 0, model.evaluations - evals0, time.process_time() - start_cpu,
                            [costs.total_s], checked)
    local = dtfm_local_search if method == "dtfm" else kl_local_search
    pop: list[tuple[float, dict[int, int]]] = []
    for _ in range(max(2, population)):
        labels = random_labels(problem, rng)
        seen(labels)
        pop.append((model.cost(problem.partition(labels)).total_s, labels))
    history = []
    for _ in range(generations):
        i, j = rng.sample(range(len(pop)), 2)
        child = crossover(problem, pop[i][1], pop[j][1], rng)
        seen(child)
        child = local(model, problem, child)
        seen(child)
        c = model.cost(problem.partition(child)).total_s
        worst = max(range(len(pop)), key=lambda t: (pop[t][0], t))
        if c < pop[worst][0]:
            pop[worst] = (c, child)
        history.append(min(p[0] for p in pop))
    best = min(pop, key=lambda p: p[0])[1]
    part = problem.partition(best)
    costs = model.cost(part)
    return SearchResult(method, part, costs, generations, model.evaluations - evals0,
                        time.process_time() - start_cpu, history, checked)
