"""Check that a routing is legal for its scenario (for tests of every policy).

A routing is legal when every flow starts at a data node, visits exactly one
relay of each stage 0..S-1 in order over existing links, and returns to the
same data node; no relay carries more flows than its capacity and no data
node sends more than its capacity; and each flow's reported cost is the sum
of the link costs along its route (`path_cost`).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable

from ..protocol.scenario import Scenario
from .result import Flow, RoutingResult, path_cost

COST_TOLERANCE = 1e-6  # relative, and absolute for costs below 1


def routing_problems(scenario: Scenario, flows: Iterable[Flow]) -> list[str]:
    """Every way in which `flows` is not a legal routing of `scenario` (empty if legal)."""
    problems: list[str] = []
    load: Counter[str] = Counter()
    for k, f in enumerate(flows):
        where = f"flow {k} ({f.data_node} via {list(f.path)})"
        if not scenario.has(f.data_node) or not scenario.node(f.data_node).is_data:
            problems.append(f"{where}: {f.data_node!r} is not a data node of the scenario")
            continue
        if len(f.path) != scenario.stages:
            problems.append(f"{where}: visits {len(f.path)} relays, the scenario has {scenario.stages} stages")
            continue
        bad_relay = False
        for stage, r in enumerate(f.path):
            if not scenario.has(r) or scenario.node(r).is_data or scenario.node(r).stage != stage:
                problems.append(f"{where}: position {stage} is {r!r}, not a relay of stage {stage}")
                bad_relay = True
        if bad_relay:
            continue
        hops = (f.data_node, *f.path, f.data_node)
        missing = [(a, b) for a, b in zip(hops, hops[1:]) if scenario.cost(a, b) is None]
        if missing:
            problems.append(f"{where}: no link for hop(s) {missing}")
            continue
        expected = path_cost(scenario, f.data_node, tuple(f.path))
        if not math.isclose(f.cost, expected, rel_tol=COST_TOLERANCE, abs_tol=COST_TOLERANCE):
            problems.append(f"{where}: reported cost {f.cost} but the links sum to {expected}")
        load.update(f.path)
        load[f.data_node] += 1
    for node_id, n in sorted(load.items()):
        cap = scenario.node(node_id).capacity
        if n > cap:
            kind = "data node" if scenario.node(node_id).is_data else "relay"
            problems.append(f"{kind} {node_id!r} carries {n} flows but its capacity is {cap}")
    return problems


def check_routing(scenario: Scenario, result: RoutingResult | Iterable[Flow]) -> None:
    """Raise AssertionError listing every problem if `result` is not a legal routing."""
    flows = result.flows if isinstance(result, RoutingResult) else list(result)
    problems = routing_problems(scenario, flows)
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise AssertionError(f"illegal routing for scenario {scenario.name!r}:\n  " + "\n  ".join(shown))
