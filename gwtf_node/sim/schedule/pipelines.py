"""From a partition to what runs: the stage of every device, the pipelines, and the units of flow per hop.

`arrange` turns a scored partition into the pipelines the way DT-FM's
reference code does: the groups in pipeline order, and each macro-batch's
devices chained through the bottleneck matchings between consecutive groups
(the first group's devices in index order).  With a pinned data group the
chain starts at each data node and its last hop goes back to the same data
node (forced: it is not a free matching, so the cost model's closing edge is a
lower bound of that hop; `closing_s` reports the real one).

`repin` is what the schedule can still do during a run without moving
weights: with every relay kept in its stage (a stage move means downloading
that stage's parameters and optimizer state), re-form pipelines over the live
relays by chaining rectangular bottleneck matchings stage by stage, as many as
the thinnest stage allows, and share their units among the live data nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costmodel import CostModel, Costs, Partition, bottleneck_matching


@dataclass(frozen=True)
class Arrangement:
    """Devices by index: `stages[s]` the relays of stage s; `pipelines[i]` = (data node, relays by stage)."""

    stages: tuple[tuple[int, ...], ...]
    pipelines: tuple[tuple[int, tuple[int, ...]], ...]
    closing_s: float  # the slowest forced hop last stage -> data node (pinned data group only)


def arrange(model: CostModel, part: Partition, costs: Costs) -> Arrangement:
    """Stage order and pipelines of a partition (module docstring); group 0 is the data group when pinned."""
    order = costs.order  # (with an anchor, the data group comes first; open loop: its first group is "stage 0")
    chains = [[d] for d in part[order[0]]]
    for g in order[1:]:
        prev = tuple(c[-1] for c in chains)
        _, pairs = model.matching(prev, part[g])
        nxt = dict(pairs)
        for c in chains:
            c.append(nxt[c[-1]])
    if model.anchor is None:
        stages = tuple(tuple(c[s] for c in chains) for s in range(len(order)))
        return Arrangement(stages, tuple((c[0], tuple(c)) for c in chains), 0.0)
    stages = tuple(tuple(c[s] for c in chains) for s in range(1, len(order)))
    closing = max((model.pp_pair_s(c[-1], c[0]) for c in chains), default=0.0)
    return Arrangement(stages, tuple((c[0], tuple(c[1:])) for c in chains), closing)


def repin(pp_s, data: list[str], stages: list[list[str]]) -> list[tuple[str, tuple[str, ...]]]:
    """Pipelines over fixed stage groups (module docstring): (first data node of the chain, relays by stage).

    `pp_s(a, b)` is the hop cost between two nodes.  At most min(len(data),
    smallest stage) pipelines; empty if a stage has no relay."""
    if not data or any(not s for s in stages):
        return []
    chains = [[d] for d in sorted(data)]
    for group in stages:
        group = sorted(group)
        w = np.array([[pp_s(c[-1], r) for r in group] for c in chains])
        k = min(len(chains), len(group))
        if len(chains) > len(group):  # keep the chains whose best next hop is cheapest
            best = w.min(axis=1)
            keep = sorted(sorted(range(len(chains)), key=lambda i: (best[i], i))[:k])
            chains, w = [chains[i] for i in keep], w[keep]
        if len(group) > k:  # pad with dummy chains so the matching is square, then drop what they took
            w = np.vstack([w, np.full((len(group) - k, len(group)), 0.0)])
        _, pairs = bottleneck_matching(w)
        for i, j in pairs:
            if i < len(chains):
                chains[i].append(group[j])
    return [(c[0], tuple(c[1:])) for c in chains]


def flows_of(pipelines: list[tuple[str, tuple[str, ...]]], data: list[str], units: int,
             ) -> dict[str, dict[str, dict[str, int]]]:
    """node -> data node -> next hop -> units (the simulator's flows), `units` per pipeline.

    Every live data node gets an equal share of the units (the first ones one
    more when they do not divide), from its own pipeline first, then from the
    others in order."""
    if not pipelines or not data:
        return {}
    total = units * len(pipelines)
    data = sorted(data)
    quota = {d: total // len(data) + (1 if i < total % len(data) else 0) for i, d in enumerate(data)}
    room = [units] * len(pipelines)
    take: list[tuple[str, int, int]] = []  # (data node, pipeline, units)
    owner = {p[0]: i for i, p in enumerate(pipelines)}
    for d in data:
        order = ([owner[d]] if d in owner else []) + [i for i in range(len(pipelines)) if owner.get(d) != i]
        for i in order:
            n = min(quota[d], room[i])
            if n > 0:
                take.append((d, i, n))
                quota[d] -= n
                room[i] -= n
    out: dict[str, dict[str, dict[str, int]]] = {}
    for d, i, n in take:
        hops = (d, *pipelines[i][1], d)
        for a, b in zip(hops, hops[1:]):
            o = out.setdefault(a, {}).setdefault(d, {})
            o[b] = o.get(b, 0) + n
    return out
