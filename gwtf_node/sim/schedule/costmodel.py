"""DT-FM's bi-level communication cost model (section 3.2-3.3 of the DT-FM paper).

A *partition* is a tuple of groups, each a tuple of device indices; group g
is the data-parallel group C_g of one stage (all devices of a group hold the
same layers, each works on its own macro-batch).  The cost of a partition is

    COMM-COST = DATAP-COST + PIPELINEP-COST                     (Eq. 1)

* DATAP-COST(C) = max over d in C of sum over d' in C - {d} of
  2 (alpha(d, d') + c_dp / (|C| beta(d, d')))                   (Eq. 2)
  (a co-located sharded parameter server: every device sends its shards to
  the others and gets the aggregated ones back), and the partition's
  DATAP-COST is the largest over its groups: they aggregate in parallel.
* The coarsened graph has one node per group; the weight of the edge C_i -
  C_j is the min-max perfect matching between their devices,
  min_M max_{(d, d') in M} 2 (alpha(d, d') + c_pp / beta(d, d'))  (Eq. 3):
  the slowest pair decides how long a pipeline hop takes between the two
  stages (the factor 2: the activation forward, its gradient backward).
  It is computed exactly: the distinct pair costs are binary-searched for the
  smallest threshold under which a perfect matching exists
  (`scipy.optimize.linear_sum_assignment` on the 0/1 "above threshold"
  matrix); among the matchings with that bottleneck, the one of least total
  cost is kept for building the pipelines.
* PIPELINEP-COST = the open-loop travelling salesman path over the coarsened
  graph (Eq. 4): the order of the stages, solved exactly by Held-Karp dynamic
  programming (the graph has one node per stage, a handful).

Adapted to GWTF's runs (`anchor`): a data node hosts both the first and the
last stage of its microbatches (embedding, head, loss), so the data nodes
form a group that is pinned (the devices holding the data cannot change) and
the pipeline is a closed tour from the data group through every relay group
back to it.  With `anchor=None` the model is the paper's: open loop, every
group free.

alpha is a one-way latency in seconds and beta a bandwidth in MB/s, both
averaged over the two directions as the paper's communication graph does;
c_pp (activation of a macro-batch) and c_dp (gradients of a stage) in MB.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

Partition = tuple[tuple[int, ...], ...]
_BIG = 1e18  # stands for "no matching under this threshold" in the assignment problem


@dataclass(frozen=True)
class Costs:
    """The cost of one partition, its parts and the structure that realises it."""

    total_s: float
    datap_s: float
    pipelinep_s: float
    order: tuple[int, ...]  # group indices in pipeline order (with an anchor: anchor first, tour closes on it)


@dataclass
class CostModel:
    """Eq. 1-4 over `n` devices; `latency_s[i][j]` (seconds) and `bandwidth_mbs[i][j]` (MB/s) are symmetric.

    `anchor` (optional): index of the group that is pinned (the data nodes)
    and where the pipeline starts and ends (module docstring).  Matching
    results are cached per pair of groups (a local-search swap changes two
    groups, so most pairs are reused); `evaluations` counts `cost` calls.
    """

    latency_s: np.ndarray
    bandwidth_mbs: np.ndarray
    c_pp_mb: float
    c_dp_mb: float
    anchor: int | None = None
    evaluations: int = 0
    _pp: np.ndarray = field(init=False, repr=False)  # 2 (alpha + c_pp / beta) per pair of devices
    _dp_lat: np.ndarray = field(init=False, repr=False)  # alpha, both directions averaged
    _dp_inv_bw: np.ndarray = field(init=False, repr=False)  # 1 / beta, both directions averaged
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        lat = 0.5 * (self.latency_s + self.latency_s.T)
        with np.errstate(divide="ignore"):
            bw = 0.5 * (self.bandwidth_mbs + self.bandwidth_mbs.T)
            self._pp = 2.0 * (lat + np.where(bw > 0, self.c_pp_mb / bw, math.inf))
            self._dp_lat = lat
            self._dp_inv_bw = np.where(bw > 0, 1.0 / bw, math.inf)
        np.fill_diagonal(self._pp, 0.0)

    @property
    def n(self) -> int:
        return self.latency_s.shape[0]

    def pp_pair_s(self, a: int, b: int) -> float:
        """2 (alpha + c_pp / beta) between two devices: one pipeline hop, forward and backward."""
        return float(self._pp[a, b])

    def datap_group_s(self, group: tuple[int, ...]) -> float:
        """Eq. 2 for one group."""
        if len(group) < 2:
            return 0.0
        idx = np.asarray(group)
        lat = self._dp_lat[np.ix_(idx, idx)]
        inv = self._dp_inv_bw[np.ix_(idx, idx)]
        per = 2.0 * (lat + self.c_dp_mb / len(group) * inv)
        np.fill_diagonal(per, 0.0)
        return float(per.sum(axis=1).max())

    def matching(self, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[float, tuple[tuple[int, int], ...]]:
        """Eq. 3: (bottleneck cost, pairs (device of a, device of b)) of the min-max perfect matching.

        Among the matchings with the least bottleneck, the one with the least sum."""
        key = (a, b)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        res = bottleneck_matching(self._pp[np.ix_(np.asarray(a), np.asarray(b))])
        out = (res[0], tuple((a[i], b[j]) for i, j in res[1]))
        self._cache[key] = out
        self._cache[(b, a)] = (out[0], tuple((y, x) for x, y in out[1]))
        if len(self._cache) > 200_000:
            self._cache.clear()
        return out

    def coarsened(self, part: Partition) -> np.ndarray:
        """The coarsened graph's weights: matching bottlenecks between every pair of groups."""
        k = len(part)
        w = np.zeros((k, k))
        for i, j in itertools.combinations(range(k), 2):
            w[i, j] = w[j, i] = self.matching(part[i], part[j])[0]
        return w

    def cost(self, part: Partition) -> Costs:
        """COMM-COST of a partition (Eq. 1), with the pipeline order that realises it."""
        self.evaluations += 1
        dp = max(self.datap_group_s(g) for g in part)
        pp, order = tsp_path(self.coarsened(part), self.anchor)
        return Costs(dp + pp, dp, pp, order)


def bottleneck_matching(w: np.ndarray) -> tuple[float, list[tuple[int, int]]]:
    """Min-max perfect matching of a square cost matrix: (bottleneck, pairs), exact.

    Binary search over the distinct entries for the least threshold t such that
    the entries <= t contain a perfect matching; then the least-sum matching
    under t (ties broken by the assignment solver, deterministic)."""
    n = w.shape[0]
    if n == 0:
        return 0.0, []
    values = np.unique(w)
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        blocked = (w > values[mid]).astype(float)
        r, c = linear_sum_assignment(blocked)
        if blocked[r, c].sum() == 0:
            hi = mid
        else:
            lo = mid + 1
    t = values[lo]
    masked = np.where(w <= t, w, _BIG)
    r, c = linear_sum_assignment(masked)
    return float(t), [(int(i), int(j)) for i, j in zip(r, c)]


def tsp_path(w: np.ndarray, anchor: int | None = None) -> tuple[float, tuple[int, ...]]:
    """Exact travelling salesman over a small complete graph (Held-Karp).

    `anchor=None`: the open-loop path of least length visiting every node once,
    any start and end (Eq. 4).  With an anchor: the closed tour through the
    anchor (it starts and ends there), returned as the order anchor first.
    Ties: the lexicographically smallest order."""
    k = w.shape[0]
    if k == 1:
        return 0.0, (0,)
    nodes = list(range(k))
    if anchor is not None:
        rest = [v for v in nodes if v != anchor]
        best = _held_karp(w, rest, start=anchor, close=anchor)
    else:
        best = min((_held_karp(w, [v for v in nodes if v != s], start=s, close=None) for s in nodes),
                   key=lambda t: (round(t[0], 12), t[1]))
    return best


def _held_karp(w: np.ndarray, rest: list[int], start: int, close: int | None) -> tuple[float, tuple[int, ...]]:
    m = len(rest)
    if m == 0:
        return 0.0, (start,)
    full = (1 << m) - 1
    dp: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {}
    for i, v in enumerate(rest):
        dp[(1 << i, i)] = (float(w[start, v]), (start, v))
    for mask in range(1, full + 1):
        for i in range(m):
            cur = dp.get((mask, i))
            if cur is None:
                continue
            for j in range(m):
                if mask & (1 << j):
                    continue
                nm = mask | (1 << j)
                cand = (cur[0] + float(w[rest[i], rest[j]]), cur[1] + (rest[j],))
                old = dp.get((nm, j))
                if old is None or (round(cand[0], 12), cand[1]) < (round(old[0], 12), old[1]):
                    dp[(nm, j)] = cand
    ends = []
    for i in range(m):
        c, order = dp[(full, i)]
        if close is not None:
            c += float(w[rest[i], close])
        ends.append((c, order))
    return min(ends, key=lambda t: (round(t[0], 12), t[1]))
