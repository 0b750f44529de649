"""DT-FM's scheduling problem built from our inputs: a scenario file, or a `sim train` setting.

Devices are indexed data nodes first (sorted ids), then relays (sorted ids).
The data nodes form the pinned group (they hold the data, and host the first
and last stage of their microbatches); the relays are split into `stages`
groups of equal size, as DT-FM requires (D_DP x D_PP = N): so the scenario
needs relays = stages x data nodes.  Link latency and bandwidth come from the
scenario's links (a link given only by `cost` counts as that many
milliseconds of latency on an infinitely fast link; a pair with no link can
never be matched: infinite latency).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from ...protocol.scenario import Scenario, ScenarioError
from .costmodel import CostModel
from .opfence import opfence, workload
from .pipelines import Arrangement, arrange
from .search import METHODS, Problem, SearchResult, search

STAGE_GRADIENT_MB = 38e6 * 4 / 1e6  # c_dp: fp32 gradients of a relay stage of the Table II model (3 blocks)
SCHEDULE_METHODS = METHODS + ("opfence",)  # opfence: FusionLLM's OP-Fence (opfence.py), no genetic search


@dataclass(frozen=True)
class Instance:
    names: tuple[str, ...]  # device index -> node id
    model: CostModel
    problem: Problem


def instance_from_scenario(sc: Scenario, gradient_mb: float = STAGE_GRADIENT_MB) -> Instance:
    data = sorted(n.id for n in sc.data_nodes)
    relays = sorted(n.id for n in sc.relays)
    if len(relays) != sc.stages * len(data):
        raise ScenarioError(
            f"DT-FM splits the relays into {sc.stages} equal stage groups, one relay per data node in each "
            f"(D_DP x D_PP = N): {len(relays)} relays with {len(data)} data node(s) over {sc.stages} stages do "
            f"not fit; give {sc.stages * len(data)} relays")
    names = tuple(data + relays)
    idx = {n: i for i, n in enumerate(names)}
    n = len(names)
    lat = np.full((n, n), math.inf)
    bw = np.full((n, n), 1.0)
    np.fill_diagonal(lat, 0.0)
    for link in sc.links:
        a, b = idx[link.a], idx[link.b]
        lat[a, b], lat[b, a] = link.delay_ms[0] / 1000.0, link.delay_ms[1] / 1000.0
        if link.bandwidth_mbps is None:
            bw[a, b] = bw[b, a] = math.inf
        else:
            bw[a, b], bw[b, a] = link.bandwidth_mbps[0] / 8.0, link.bandwidth_mbps[1] / 8.0
    model = CostModel(lat, bw, sc.activation_mb, gradient_mb, anchor=0)
    problem = Problem(tuple(range(len(data), n)), (len(data),) * sc.stages, tuple(range(len(data))))
    return Instance(names, model, problem)


def instance_from_setting(setting) -> Instance:
    """The problem of a `sim.train.Setting` (every pair linked as its `Net` says)."""
    from ..train.setting import ACTIVATION_MB, STAGE_SIZES

    data = sorted(setting.data)
    relays = sorted(setting.relays)
    names = tuple(data + relays)
    n = len(names)
    lat = np.zeros((n, n))
    bw = np.full((n, n), math.inf)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i != j:
                la, ba = setting.net.link(a, b)
                lat[i, j], bw[i, j] = la / 1000.0, ba / 8.0
    stages = len(STAGE_SIZES)
    if len(relays) % stages:
        raise ValueError(f"{len(relays)} relays cannot form {stages} equal stage groups")
    model = CostModel(lat, bw, ACTIVATION_MB, STAGE_GRADIENT_MB, anchor=0)
    problem = Problem(tuple(range(len(data), n)), (len(relays) // stages,) * stages, tuple(range(len(data))))
    return Instance(names, model, problem)


@dataclass(frozen=True)
class Schedule:
    instance: Instance
    result: SearchResult
    arrangement: Arrangement
    extra: dict = field(default_factory=dict)  # opfence: its clusters and Eq. 3 estimates (node ids)

    def stages(self) -> list[list[str]]:
        return [[self.instance.names[d] for d in s] for s in self.arrangement.stages]

    def pipelines(self) -> list[tuple[str, tuple[str, ...]]]:
        nm = self.instance.names
        return [(nm[d], tuple(nm[r] for r in path)) for d, path in self.arrangement.pipelines]

    def to_json(self) -> dict:
        r = self.result
        return {
            "method": r.method, "total_cost_s": r.costs.total_s, "datap_cost_s": r.costs.datap_s,
            "pipelinep_cost_s": r.costs.pipelinep_s, "closing_hop_s": self.arrangement.closing_s,
            "generations": r.generations, "evaluations": r.evaluations, "cpu_s": r.cpu_s,
            "stages": self.stages(),
            "pipelines": [{"data_node": d, "path": list(p)} for d, p in self.pipelines()],
            **self.extra,
        }


def schedule(inst: Instance, method: str, seed: int, **kw) -> Schedule:
    """Run DT-FM's scheduler (`method`: dtfm, kl or random) with a seeded RNG, `kw`: population, generations;
    or OP-Fence (`method="opfence"`, `kw`: resolution, microbatches; `opfence_schedule`)."""
    if method == "opfence":
        return opfence_schedule(inst, seed, **kw)
    res = search(inst.model, inst.problem, method, random.Random(f"dtfm:{method}:{seed}"), **kw)
    return Schedule(inst, res, arrange(inst.model, res.partition, res.costs))


def opfence_schedule(inst: Instance, seed: int, resolution: float = 1.0, microbatches: int = 4) -> Schedule:
    """OP-Fence's placement and pipelines (`opfence.py`) as a Schedule: DT-FM's COMM-COST of its partition
    beside it (one cost-model evaluation, not counted in the CPU time), its clusters and Eq. 3 estimates in
    `extra`."""
    model, prob = inst.model, inst.problem
    if prob.pinned is None:
        raise ValueError("OP-Fence places relays around the data nodes: the problem needs its pinned data group")
    data, stages = tuple(prob.pinned), len(prob.sizes)
    wl = workload(stages, model.c_pp_mb, microbatches)
    plan = opfence(model.latency_s, model.bandwidth_mbs, data, tuple(prob.free), stages, wl, seed, resolution)
    part = (tuple(sorted(data)),) + plan.stages
    evals0 = model.evaluations
    costs = model.cost(part)
    res = SearchResult("opfence", part, costs, 0, model.evaluations - evals0, plan.cpu_s, [costs.total_s], 1)
    closing = max((model.pp_pair_s(p[-1], d) for d, p in plan.pipelines), default=0.0)
    nm = inst.names
    extra = {"clusters": [[nm[v] for v in c] for c in plan.clusters],
             "runs": {nm[d]: [[k, a, b] for k, a, b in r] for d, r in sorted(plan.runs.items())},
             "estimated_pipeline_s": {nm[d]: t for d, t in sorted(plan.pipeline_s.items())}}
    return Schedule(inst, res, Arrangement(plan.stages, plan.pipelines, closing), extra)


def setting_scenario(setting) -> dict:
    """A `sim.train.Setting` as a scenario file (specs/scenario.md): every pair of nodes linked with its
    latency and bandwidth, the relays at their given stage; `sim schedule` reads it."""
    from ..train.setting import ACTIVATION_MB, STAGE_SIZES

    names = sorted(setting.data) + sorted(setting.relays)
    nodes = [{"id": d, "role": "data", "capacity": 4} for d in sorted(setting.data)]
    nodes += [{"id": r, "role": "relay", "stage": setting.relays[r][0], "capacity": setting.relays[r][1]}
              for r in sorted(setting.relays)]
    links = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (la, ba), (lb, bb) = setting.net.link(a, b), setting.net.link(b, a)
            links.append({"a": a, "b": b, "latency_ms": [la, lb], "bandwidth_mbps": [ba, bb]})
    return {"name": setting.name, "stages": len(STAGE_SIZES), "activation_mb": ACTIVATION_MB, "nodes": nodes,
            "links": links}
