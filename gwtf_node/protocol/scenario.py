"""Scenario files (../shared/specs/scenario.md): nodes, stages and links.

A scenario is parsed once at the edge (the CLI reads the file, this module
checks the decoded JSON) into frozen dataclasses that the simulator, the
baselines and the link emulation share.  Parsing is pure: it takes the
decoded object, never a path, and every problem is a `ScenarioError` whose
message names the offending entry so that the CLI can print one line.

Link costs follow Equation 1 (`cost.link_cost`).  A link given with
`latency_ms`/`bandwidth_mbps` is converted with the activation size of the
run (`activation_mb`, an optional top-level key of ours; default
`DEFAULT_ACTIVATION_MB`).  The one-way delay of a link, used by the
simulator to deliver messages, is the mean latency when one is given and
otherwise the link's cost read as milliseconds (Table V only gives costs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from .cost import link_cost

DEFAULT_ACTIVATION_MB = 4.0  # activation of one microbatch when a scenario does not say
ROLE_DATA = "data"
ROLE_RELAY = "relay"


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class NodeSpec:
    id: str
    role: str
    capacity: int
    stage: int | None = None  # None for data nodes
    compute_ms: float = 0.0
    memory_mb: float | None = None

    @property
    def is_data(self) -> bool:
        return self.role == ROLE_DATA


@dataclass(frozen=True)
class LinkSpec:
    a: str
    b: str
    cost: float  # d(a, b) of Equation 1, symmetric
    delay_ms: tuple[float, float]  # one-way delay a->b and b->a
    bandwidth_mbps: tuple[float, float] | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    stages: int
    nodes: tuple[NodeSpec, ...]
    links: tuple[LinkSpec, ...]
    activation_mb: float = DEFAULT_ACTIVATION_MB
    _by_id: dict = field(default_factory=dict, compare=False, repr=False)
    _adj: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_id.update({n.id: n for n in self.nodes})
        for link in self.links:
            self._adj.setdefault(link.a, {})[link.b] = link
            self._adj.setdefault(link.b, {})[link.a] = link

    def node(self, node_id: str) -> NodeSpec:
        return self._by_id[node_id]

    def has(self, node_id: str) -> bool:
        return node_id in self._by_id

    @property
    def data_nodes(self) -> list[NodeSpec]:
        return [n for n in self.nodes if n.is_data]

    @property
    def relays(self) -> list[NodeSpec]:
        return [n for n in self.nodes if not n.is_data]

    def relays_of_stage(self, stage: int) -> list[NodeSpec]:
        return [n for n in self.nodes if not n.is_data and n.stage == stage]

    def neighbours(self, node_id: str) -> dict[str, LinkSpec]:
        return self._adj.get(node_id, {})

    def cost(self, a: str, b: str) -> float | None:
        link = self._adj.get(a, {}).get(b)
        return None if link is None else link.cost

    def delay_ms(self, a: str, b: str) -> float | None:
        link = self._adj.get(a, {}).get(b)
        if link is None:
            return None
        return link.delay_ms[0] if link.a == a else link.delay_ms[1]

    def to_json(self) -> dict[str, Any]:
        """The scenario in the file format (links as given costs)."""
        nodes = []
        for n in self.nodes:
            entry: dict[str, Any] = {"id": n.id, "role": n.role, "capacity": n.capacity}
            if n.stage is not None:
                entry["stage"] = n.stage
            if n.compute_ms:
                entry["compute_ms"] = n.compute_ms
            if n.memory_mb is not None:
                entry["memory_mb"] = n.memory_mb
            nodes.append(entry)
        links = [{"a": l.a, "b": l.b, "cost": l.cost} for l in self.links]
        return {"name": self.name, "stages": self.stages, "nodes": nodes, "links": links}


def _number(value: Any, what: str, *, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ScenarioError(f"{what} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ScenarioError(f"{what} must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")
    return float(value)


def _pair(value: Any, what: str, *, allow_zero: bool = True) -> tuple[float, float]:
    if isinstance(value, list):
        if len(value) != 2:
            raise ScenarioError(f"{what} must be a number or a [a->b, b->a] pair, got a list of {len(value)}")
        return (_number(value[0], what, allow_zero=allow_zero), _number(value[1], what, allow_zero=allow_zero))
    v = _number(value, what, allow_zero=allow_zero)
    return (v, v)


def _parse_nodes(raw_nodes: list, stages: int) -> list[NodeSpec]:
    """The scenario's nodes: unique ids, roles, capacities, a relay's stage among `stages`, compute and memory."""
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for k, raw in enumerate(raw_nodes):
        if not isinstance(raw, Mapping):
            raise ScenarioError(f"nodes[{k}] must be an object")
        nid = raw.get("id")
        if not isinstance(nid, str) or not nid:
            raise ScenarioError(f"nodes[{k}] has no string 'id'")
        if nid in seen:
            raise ScenarioError(f"duplicate node id {nid!r}")
        seen.add(nid)
        role = raw.get("role")
        if role not in (ROLE_DATA, ROLE_RELAY):
            raise ScenarioError(f"node {nid!r}: 'role' must be 'data' or 'relay', got {role!r}")
        cap = raw.get("capacity")
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap != int(cap) or cap < 0:
            raise ScenarioError(f"node {nid!r}: 'capacity' must be a non-negative integer, got {cap!r}")
        stage = raw.get("stage")
        if role == ROLE_RELAY:
            if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < stages:
                raise ScenarioError(f"relay {nid!r}: 'stage' must be an integer in 0..{stages - 1}, got {stage!r}")
        else:
            stage = None
        compute = _number(raw.get("compute_ms", 0.0), f"node {nid!r}: 'compute_ms'")
        mem = raw.get("memory_mb")
        if mem is not None:
            mem = _number(mem, f"node {nid!r}: 'memory_mb'")
        nodes.append(NodeSpec(nid, role, int(cap), stage, compute, mem))
    return nodes


def _parse_links(raw_links: list, by_id: Mapping[str, NodeSpec], size: float) -> list[LinkSpec]:
    """The scenario's links between known nodes, each given its cost, or its latency and bandwidth (the cost then
    comes from the cost model, for activations of `size` MB)."""
    links: list[LinkSpec] = []
    pairs: set[frozenset[str]] = set()
    for k, raw in enumerate(raw_links):
        if not isinstance(raw, Mapping):
            raise ScenarioError(f"links[{k}] must be an object")
        a, b = raw.get("a"), raw.get("b")
        for end in (a, b):
            if end not in by_id:
                raise ScenarioError(f"links[{k}] ({a!r} - {b!r}) names an unknown node {end!r}")
        if a == b:
            raise ScenarioError(f"links[{k}] joins {a!r} to itself")
        key = frozenset((a, b))
        if key in pairs:
            raise ScenarioError(f"duplicate link between {a!r} and {b!r}")
        pairs.add(key)
        bw = None
        if "cost" in raw:
            cost = _number(raw["cost"], f"link {a!r} - {b!r}: 'cost'")
            if "latency_ms" in raw:
                delay = _pair(raw["latency_ms"], f"link {a!r} - {b!r}: 'latency_ms'")
            else:
                delay = (cost, cost)
        elif "latency_ms" in raw and "bandwidth_mbps" in raw:
            delay = _pair(raw["latency_ms"], f"link {a!r} - {b!r}: 'latency_ms'")
            bw = _pair(raw["bandwidth_mbps"], f"link {a!r} - {b!r}: 'bandwidth_mbps'", allow_zero=False)
            cost = link_cost(by_id[a].compute_ms, by_id[b].compute_ms, delay[0], delay[1], bw[0], bw[1], size)
        else:
            raise ScenarioError(f"link {a!r} - {b!r} needs either 'cost' or both 'latency_ms' and 'bandwidth_mbps'")
        links.append(LinkSpec(a, b, cost, delay, bw))
    return links


def parse_scenario(obj: Any, *, activation_mb: float | None = None) -> Scenario:
    """Check a decoded scenario and build a `Scenario`, or raise `ScenarioError`."""
    if not isinstance(obj, Mapping):
        raise ScenarioError("a scenario must be a JSON object with 'stages', 'nodes' and 'links'")
    for key in ("stages", "nodes", "links"):
        if key not in obj:
            raise ScenarioError(f"the scenario has no '{key}' key")
    stages = obj["stages"]
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ScenarioError(f"'stages' must be a positive integer, got {stages!r}")
    size = activation_mb if activation_mb is not None else obj.get("activation_mb", DEFAULT_ACTIVATION_MB)
    size = _number(size, "'activation_mb'", allow_zero=True)
    if not isinstance(obj["nodes"], list) or not obj["nodes"]:
        raise ScenarioError("'nodes' must be a non-empty list")
    if not isinstance(obj["links"], list):
        raise ScenarioError("'links' must be a list")

    nodes = _parse_nodes(obj["nodes"], stages)
    by_id = {n.id: n for n in nodes}

    links = _parse_links(obj["links"], by_id, size)

    if not any(n.is_data for n in nodes):
        raise ScenarioError("the scenario has no data node")
    name = obj.get("name", "scenario")
    if not isinstance(name, str):
        raise ScenarioError(f"'name' must be a string, got {name!r}")
    return Scenario(name, stages, tuple(nodes), tuple(links), size)


def published_bandwidth_mbps(mbps: float) -> float:
    """A bandwidth of a published location file (`data/geo12-links.json`) as the simulator and the daemon use it.

    The file gives the NL-London link about 2 Mbit/s, flagged in its own note as
    a typo for about 2 Gbit/s (every other link is at least 50 Mbit/s): an
    entry below 10 Mbit/s is read in Gbit/s."""
    return mbps * 1000.0 if mbps < 10 else mbps
