"""FusionLLM's OP-Fence scheduler (Tang et al., "FusionLLM: A Decentralized LLM Training System on
Geo-distributed GPUs with Adaptive Compression", section 3.5-3.6 and 4) as a placement baseline.

Theory of operation
-------------------
OP-Fence rests on two observations of the paper: a model's operator graph is
nearly a chain, and the bandwidth between volunteers is clustered by
geography.  It (1) estimates the workload of every layer and the time of
every cut, (2) finds the high-bandwidth clusters of the devices with the
Louvain algorithm, and (3) gives every cluster operators that form a
connected sub-graph, so that data crosses a slow link only where a run of
layers leaves one cluster for the next.  Here, on GWTF's model and swarms:

* Workload estimator (`Workload`, section 3.5-3.6).  Compute per layer from
  the stage profile (`gwtf_node/data/stage_profile.json`, the simulator's
  time scale): a relay block's forward and backward are the profiled relay
  stage's divided by its blocks; the data node's first layers (embedding and
  its block) and last ones (head and loss) are its profiled parts.  A cut
  between two devices costs 2 (alpha + M / beta): the activation M forward
  and its gradient backward over a link of latency alpha and bandwidth beta
  (DT-FM's pipeline hop, `CostModel.pp_pair_s`).  A pipeline's time is the
  paper's Eq. 3, sum_p (C_p + R_p) + (n_b - 1) max_p max(C_p, R_p): C_p the
  compute of device p, R_p the cut into it, n_b the microbatches it pipelines
  (`Workload.pipeline_s`).
* Clusters (section 4): `networkx.community.louvain_communities` over the
  bandwidth graph of every device (data nodes included: they host the
  first and last layers), edge weight the mean bandwidth of both directions
  in MB/s (an unlimited link weighs 10 x the fastest finite one), seeded.
* Stages are the model's connected runs of layers: the daemon's relay part
  holds a fixed run of blocks (3 in GWTF's model), so OP-Fence does not move
  stage boundaries; with homogeneous relays every stage's compute is the same
  and the estimator's compute only enters Eq. 3.  What OP-Fence decides is
  which cluster serves which run of stages of which pipeline.

Choices where the paper leaves them open
----------------------------------------
* Data parallelism.  The paper schedules one pipeline; GWTF's swarm trains
  one pipeline per data node (the data node hosts its first and last
  layers) with the relays of a stage as data-parallel replicas.  Every
  pipeline is one chain of the operator graph, and "a connected sub-graph per
  cluster" is applied per chain: within a pipeline, each cluster serves one
  connected run of stages.  Every stage gets one relay per pipeline (DT-FM's
  D_DP x D_PP = N), so relays = stages x data nodes.
* Which run of which pipeline goes to which cluster (`assign_runs`), and
  which relay of a cluster takes which stage (`chain`): their docstrings.

`opfence` returns the clusters, every pipeline's runs, the stage groups and
pipelines, Eq. 3 per pipeline, and the CPU time of the whole scheduler
(Louvain, assignment, chaining).  `problems.schedule(..., "opfence")` wraps
it as a `Schedule`, DT-FM's COMM-COST of the partition beside it, so that
`sim schedule`, `sim train --routing dtfm` (fixed pipelines) and
`--placement opfence` (GWTF's flows over it) use it as DT-FM's.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import numpy as np

PROFILE_FILE = Path(__file__).resolve().parents[2] / "data" / "stage_profile.json"
FORWARD_S = 0.35  # the simulator's anchor: a relay stage's forward (sim/train/setting.py), seconds
UNLIMITED_WEIGHT = 10.0  # an unlimited link weighs this many times the fastest finite one in the Louvain graph


@dataclass(frozen=True)
class Workload:
    """The estimator: compute per layer (forward + backward, seconds) and the activation crossing every cut.

    `layer_s` in model order: the data node's first layers, the relay blocks stage by stage, its last layers;
    `stage_layers[s]` the indices of relay stage s's layers."""

    layer_s: tuple[float, ...]
    stage_layers: tuple[tuple[int, ...], ...]
    first_layers: tuple[int, ...]
    last_layers: tuple[int, ...]
    activation_mb: float
    microbatches: int

    def stage_s(self, s: int) -> float:
        return sum(self.layer_s[i] for i in self.stage_layers[s])

    def data_s(self) -> float:
        return sum(self.layer_s[i] for i in self.first_layers + self.last_layers)

    def cut_s(self, latency_s: float, bandwidth_mbs: float) -> float:
        """2 (alpha + M / beta): the activation forward and its gradient backward over one link."""
        if bandwidth_mbs <= 0:
            return math.inf
        return 2.0 * (latency_s + self.activation_mb / bandwidth_mbs)

    def pipeline_s(self, cuts_s: list[float]) -> float:
        """Eq. 3 of the paper for one pipeline: `cuts_s[i]` the cut into stage i's relay, the last one the cut
        back into the data node (len = stages + 1)."""
        comp = [self.stage_s(s) for s in range(len(self.stage_layers))] + [self.data_s()]
        per = [c + r for c, r in zip(comp, cuts_s)]
        return sum(per) + (self.microbatches - 1) * max(max(c, r) for c, r in zip(comp, cuts_s))


def workload(stages: int, activation_mb: float, microbatches: int = 4, forward_s: float = FORWARD_S,
             profile: Path = PROFILE_FILE) -> Workload:
    """The estimator for `stages` relay stages from the stage profile (module docstring)."""
    prof = json.loads(profile.read_text())
    blocks = int(prof["model"]["relay_blocks"])
    r = prof["ratio_to_relay_forward"]
    block = forward_s * (r["relay_forward"] + r["relay_backward"]) / blocks
    layer_s = [forward_s * (r["data_forward"] + r["data_final"])]  # embedding + block, forward and backward
    stage_layers = []
    for _ in range(stages):
        stage_layers.append(tuple(range(len(layer_s), len(layer_s) + blocks)))
        layer_s += [block] * blocks
    layer_s.append(forward_s * r["data_loss"])  # norm + head + loss with their backward
    return Workload(tuple(layer_s), tuple(stage_layers), (0,), (len(layer_s) - 1,), activation_mb, microbatches)


def bandwidth_graph(bandwidth_mbs: np.ndarray) -> nx.Graph:
    """Devices as nodes, the mean bandwidth of both directions (MB/s) as the weight of every link."""
    bw = 0.5 * (bandwidth_mbs + bandwidth_mbs.T)
    finite = bw[np.isfinite(bw) & (bw > 0)]
    cap = UNLIMITED_WEIGHT * float(finite.max()) if finite.size else 1.0
    g = nx.Graph()
    n = bw.shape[0]
    g.add_nodes_from(range(n))
    for i in range(n):
        for j in range(i + 1, n):
            w = float(bw[i, j])
            if w > 0:
                g.add_edge(i, j, weight=min(w, cap))
    return g


def clusters(bandwidth_mbs: np.ndarray, seed: int, resolution: float = 1.0) -> tuple[tuple[int, ...], ...]:
    """Louvain communities of the bandwidth graph, seeded; each sorted, ordered by their smallest device."""
    if resolution <= 0:
        raise ValueError(f"Louvain resolution {resolution:g}: it must be positive")
    comms = nx.community.louvain_communities(bandwidth_graph(bandwidth_mbs), weight="weight",
                                             resolution=resolution, seed=seed)
    return tuple(sorted((tuple(sorted(c)) for c in comms), key=lambda c: c[0]))


@dataclass(frozen=True)
class Plan:
    """OP-Fence's schedule, devices by index.  `runs[d]`: (cluster, first stage, last stage) of data node d's
    pipeline; `pipelines[i]` = (data node, relays by stage); `stages[s]` the relays of stage s."""

    clusters: tuple[tuple[int, ...], ...]
    runs: dict[int, tuple[tuple[int, int, int], ...]]
    stages: tuple[tuple[int, ...], ...]
    pipelines: tuple[tuple[int, tuple[int, ...]], ...]
    pipeline_s: dict[int, float]  # Eq. 3 of every pipeline, by data node
    cpu_s: float


class _Cuts:
    """Pair and cluster-to-cluster cut estimates over the latency (s) and bandwidth (MB/s) matrices."""

    def __init__(self, wl: Workload, latency_s: np.ndarray, bandwidth_mbs: np.ndarray) -> None:
        lat = 0.5 * (latency_s + latency_s.T)
        bw = 0.5 * (bandwidth_mbs + bandwidth_mbs.T)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.pair = 2.0 * (lat + np.where(bw > 0, wl.activation_mb / bw, math.inf))
        np.fill_diagonal(self.pair, 0.0)
        self._between: dict[tuple[int, int], float] = {}

    def between(self, groups, a: int, b: int) -> float:
        key = (min(a, b), max(a, b))
        if key not in self._between:
            if a == b:
                vals = [self.pair[i, j] for i in groups[a] for j in groups[a] if i < j]
            else:
                vals = [self.pair[i, j] for i in groups[a] for j in groups[b]]
            self._between[key] = float(statistics.median(vals)) if vals else 0.0
        return self._between[key]


def assign_runs(groups, home: dict[int, int], free: dict[int, int], stages: int, cuts: _Cuts,
                ) -> dict[int, tuple[tuple[int, int, int], ...]]:
    """Runs of stages per pipeline: data node -> ((cluster, first, last), ...).

    `home[d]` the cluster of data node d, `free[k]` the relays of cluster k not yet given a stage.

    Pipelines in data-node id order.
    First, every data node whose own cluster still has a relay for every stage
    gets its whole pipeline inside that cluster (no slow cut at all).  Then
    each remaining pipeline is cut into runs greedily from stage 0: the next
    run goes to the cluster, not used yet by this pipeline, with free relays
    that can take the longest run (fewest cuts), ties broken by the estimated
    cut from the previous run's cluster (its data node's for the first run;
    plus the cut back to the data node when the run ends the chain), then by
    cluster index.  A cluster-to-cluster cut is the median of the pair cuts
    between their devices.  The data node's own cluster comes first when it has
    free relays (its run then starts next to the data node).
    """
    free = dict(free)
    out: dict[int, tuple[tuple[int, int, int], ...]] = {}
    for d in sorted(home):  # whole pipelines inside the data node's own cluster
        if free[home[d]] >= stages:
            out[d] = ((home[d], 0, stages - 1),)
            free[home[d]] -= stages
    for d in sorted(set(home) - set(out)):
        runs: list[tuple[int, int, int]] = []
        stage, prev, used = 0, home[d], set()
        while stage < stages:
            left = stages - stage
            cands = [k for k in free if free[k] > 0 and k not in used]
            if not cands:
                raise ValueError("OP-Fence ran out of clusters with free relays (relays != stages x data nodes)")

            def key(k: int) -> tuple:
                n = min(free[k], left)
                cut = cuts.between(groups, prev, k) + (cuts.between(groups, k, home[d]) if n == left else 0.0)
                return (k != home[d] or bool(runs), -n, cut, k)
            k = min(cands, key=key)
            n = min(free[k], left)
            runs.append((k, stage, stage + n - 1))
            free[k] -= n
            used.add(k)
            stage, prev = stage + n, k
        out[d] = tuple(runs)
    return out


def chain(runs: dict[int, tuple[tuple[int, int, int], ...]], groups, relays: set[int], cuts: _Cuts,
          stages: int) -> dict[int, list[int]]:
    """Relays to stages within every cluster: nearest-neighbour chaining of each run.

    Each run is chained from the previous hop (the data node, or the last relay of the previous run) by
    nearest neighbour: the free relay of the cluster with the cheapest cut from the previous device takes the
    next stage (ties by index).
    """
    free = {k: sorted(set(g) & relays) for k, g in enumerate(groups)}
    out: dict[int, list[int]] = {}
    for d in sorted(runs):
        path: list[int] = []
        prev = d
        for k, a, b in runs[d]:
            for _ in range(a, b + 1):
                r = min(free[k], key=lambda x: (cuts.pair[prev, x], x))
                free[k].remove(r)
                path.append(r)
                prev = r
        if len(path) != stages:
            raise ValueError(f"OP-Fence gave data node {d} {len(path)} relays for {stages} stages")
        out[d] = path
    return out


def opfence(latency_s: np.ndarray, bandwidth_mbs: np.ndarray, data: tuple[int, ...], relays: tuple[int, ...],
            stages: int, wl: Workload, seed: int, resolution: float = 1.0) -> Plan:
    """OP-Fence over devices 0..n-1 (`data` and `relays` by index; module docstring)."""
    if stages < 1 or not data:
        raise ValueError("OP-Fence needs at least one stage and one data node")
    if len(relays) != stages * len(data):
        raise ValueError(f"OP-Fence gives every pipeline one relay per stage: {len(relays)} relays with "
                         f"{len(data)} data node(s) over {stages} stages do not fit; give {stages * len(data)}")
    t0 = time.process_time()
    groups = clusters(bandwidth_mbs, seed, resolution)
    of = {v: k for k, g in enumerate(groups) for v in g}
    rset = set(relays)
    cuts = _Cuts(wl, latency_s, bandwidth_mbs)
    runs = assign_runs(groups, {d: of[d] for d in data}, {k: len(set(g) & rset) for k, g in enumerate(groups)},
                       stages, cuts)
    paths = chain(runs, groups, rset, cuts, stages)
    cpu = time.process_time() - t0
    pipelines = tuple((d, tuple(paths[d])) for d in sorted(paths))
    stage_groups = tuple(tuple(sorted(p[s] for _, p in pipelines)) for s in range(stages))
    est = {}
    for d, p in pipelines:
        hops = (d, *p, d)
        est[d] = wl.pipeline_s([float(cuts.pair[a, b]) for a, b in zip(hops, hops[1:])])
    return Plan(groups, runs, stage_groups, pipelines, est, cpu)


def valid_plan(plan: Plan, data: tuple[int, ...], relays: tuple[int, ...], stages: int) -> list[str]:
    """What is wrong with a plan (empty: nothing): every relay in exactly one stage, every stage served by one
    relay of every pipeline, each pipeline's runs connected and covering stages 0..S-1 once, one run per
    cluster per pipeline, every run's relays inside its cluster."""
    errs = []
    seen = [r for g in plan.stages for r in g]
    if sorted(seen) != sorted(relays):
        errs.append("the stages do not hold every relay exactly once")
    if any(len(g) != len(data) for g in plan.stages):
        errs.append(f"a stage does not have {len(data)} relays")
    of = {v: k for k, g in enumerate(plan.clusters) for v in g}
    for d, path in plan.pipelines:
        runs = plan.runs[d]
        covered = [s for _, a, b in runs for s in range(a, b + 1)]
        if covered != list(range(stages)):
            errs.append(f"pipeline of {d}: its runs cover stages {covered}")
        if len({k for k, _, _ in runs}) != len(runs):
            errs.append(f"pipeline of {d}: a cluster serves two runs")
        for k, a, b in runs:
            if any(of[path[s]] != k for s in range(a, b + 1)):
                errs.append(f"pipeline of {d}: a relay of the run {a}-{b} is outside cluster {k}")
        if any(path[s] not in plan.stages[s] for s in range(min(stages, len(path)))) or len(path) != stages:
            errs.append(f"pipeline of {d}: its path does not follow the stages")
    return errs
