"""The outcome of a routing policy, in the shape `gwtf-node sim flow --json` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..protocol.scenario import Scenario


@dataclass(frozen=True)
class Flow:
    data_node: str
    path: tuple[str, ...]  # one relay per stage, stage 0 first
    cost: float


def path_cost(scenario: Scenario, data_node: str, path: tuple[str, ...]) -> float:
    """Sum of d over data node -> stage 0 -> ... -> stage S-1 -> data node."""
    hops = (data_node, *path, data_node)
    total = 0.0
    for a, b in zip(hops, hops[1:]):
        c = scenario.cost(a, b)
        if c is None:
            raise ValueError(f"no link between {a!r} and {b!r}")
        total += c
    return total


@dataclass
class RoutingResult:
    scenario: str
    policy: str
    seed: int
    flows: list[Flow]
    rounds: int = 0
    converged_round: int = 0
    messages: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the LP bound

    @property
    def num_flows(self) -> int:
        return len(self.flows)

    @property
    def total_cost(self) -> float:
        return float(sum(sorted(f.cost for f in self.flows)))

    @property
    def mean_cost(self) -> float:
        return self.total_cost / len(self.flows) if self.flows else 0.0

    @property
    def max_cost(self) -> float:
        return max((f.cost for f in self.flows), default=0.0)

    def to_json(self) -> dict[str, Any]:
        flows = sorted(self.flows, key=lambda f: (f.data_node, f.path))
        out = {
            "scenario": self.scenario, "policy": self.policy, "seed": self.seed,
            "flows": [{"data_node": f.data_node, "path": list(f.path), "cost": f.cost} for f in flows],
            "num_flows": self.num_flows, "total_cost": self.total_cost,
            "mean_cost": self.mean_cost, "max_cost": self.max_cost,
            "rounds": self.rounds, "converged_round": self.converged_round, "messages": self.messages,
        }
        out.update(self.extra)
        return out
