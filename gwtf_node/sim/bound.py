"""The throughput a swarm's compute, links and shared CPU allow: a maximum flow of microbatches through the stages.

Theory of operation
-------------------
A microbatch leaves a data node, crosses one relay of every stage in order
and comes back to a data node; every node handles it once (a relay its
forward and backward, the data node its embedding, head and loss).  So the
microbatches per second a swarm can sustain are bounded by the maximum flow
from the data nodes, through the stages, back to the data nodes, where

* each relay is a split vertex (in -> out) whose capacity is the
  microbatches per second it can handle (its compute rate, or its network
  card's rate over the bytes of one microbatch, whichever is lower), and a
  data node's capacity sits on the source's edge to it;
* each link between adjacent stages is an edge whose capacity is the
  microbatches per second its bandwidth carries.

Nodes that share CPU cores (a test swarm on one machine) have one more
capacity, which is not an edge: with `cpu_s[v]` the CPU seconds a unit of
flow costs at v, a flow f is feasible only if sum_v f_v * cpu_s[v] <= cores.
The bound is then the largest flow value whose min-cost flow fits the budget:
the min cost of a flow of value F is convex and increasing in F (successive
shortest paths take the cheapest paths first), so a bisection on F finds it,
each step a min-cost flow (networkx's network simplex on integers: flows in
millionths of a microbatch per second, costs in 0.1 ms).

With several data nodes the flow is a relaxation (a microbatch may return
to another data node than the one that sent it), still an upper bound.
Latency does not appear: with enough microbatches in flight it delays each
one but does not cap the rate.
"""

from __future__ import annotations

import math

import networkx as nx

FLOW_SCALE = 10**6  # microbatches/s -> integer units of the min-cost flow search
COST_SCALE = 10**4  # CPU seconds per microbatch -> integer costs
SOURCE, SINK = ("source",), ("sink",)  # tuples: no node name collides with them


def throughput_bound(stage_of: dict[str, int], node_rate: dict[str, float], link_rate: dict[tuple[str, str], float],
                     cpu_s: dict[str, float] | None = None, cores: float | None = None) -> dict:
    """The most microbatches per second the swarm can push end to end.

    `stage_of`: node -> its stage (-1: a data node); `node_rate`: node -> the
    microbatches per second it can handle (its split vertex's capacity);
    `link_rate`: (a, b) -> microbatches per second the link from a to the next
    stage's b carries (a missing pair: no link); `cpu_s`: node -> CPU seconds
    one microbatch costs there, and `cores`: CPU seconds per second all nodes
    share (None: no shared CPU).  A data node is the source (its capacity
    covers its whole part: embedding, head and loss) and the sink; with
    several data nodes the flow is a relaxation (a microbatch may come back to
    another one), still an upper bound.

    Returns `microbatches_per_s` (the bound), `flow_only` (the maximum flow,
    CPU left out) and `limited_by` ("cpu" or "flow").
    """
    stages = sorted({s for s in stage_of.values() if s >= 0})
    if not stages:
        raise ValueError("no relay stage")
    last = stages[-1]
    g = nx.DiGraph()

    def cap(rate: float) -> int:
        return max(0, int(rate * FLOW_SCALE)) if math.isfinite(rate) else 10**15

    def cost(node: str) -> int:
        return round((cpu_s or {}).get(node, 0.0) * COST_SCALE)

    for n, s in stage_of.items():
        if s < 0:
            g.add_edge(SOURCE, f"{n}:out", capacity=cap(node_rate[n]), weight=cost(n))
            g.add_edge(f"{n}:in", SINK, capacity=cap(math.inf), weight=0)
        else:
            g.add_edge(f"{n}:in", f"{n}:out", capacity=cap(node_rate[n]), weight=cost(n))
    for (a, b), rate in link_rate.items():
        sa, sb = stage_of[a], stage_of[b]
        if (sa < 0 and sb == stages[0]) or (sa >= 0 and sb == sa + 1) or (sa == last and sb < 0):
            g.add_edge(f"{a}:out", f"{b}:in", capacity=cap(rate), weight=0)
    if SOURCE not in g or SINK not in g:
        return {"microbatches_per_s": 0.0, "flow_only": 0.0, "limited_by": "flow"}
    top = nx.maximum_flow_value(g, SOURCE, SINK)
    flow_only = top / FLOW_SCALE
    if cores is None or not cpu_s:
        return {"microbatches_per_s": flow_only, "flow_only": flow_only, "limited_by": "flow"}
    budget = cores * COST_SCALE * FLOW_SCALE  # cost units per second

    def min_cost(units: int) -> int:
        h = g.copy()
        h.add_edge("limit", SOURCE, capacity=units, weight=0)
        return nx.cost_of_flow(h, nx.max_flow_min_cost(h, "limit", SINK))

    if min_cost(top) <= budget:
        return {"microbatches_per_s": flow_only, "flow_only": flow_only, "limited_by": "flow"}
    lo, hi = 0, top  # min_cost is increasing and convex in the flow: the largest flow within the budget
    while hi - lo > max(1, top // 10**6):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if min_cost(mid) <= budget else (lo, mid)
    return {"microbatches_per_s": lo / FLOW_SCALE, "flow_only": flow_only, "limited_by": "cpu"}
