"""Generated scenarios: the flow-test settings of Table V of the GWTF paper.

Relays are spread evenly over the stages (relay k goes to stage k mod S, so
stages differ by at most one relay); every data node is linked to every relay
of the first and the last stage, and every relay to every relay of the next
stage.  Capacities are floor(U(lo, hi)) and link costs floor(U(lo, hi)), drawn
from a `random.Random(seed)` in a fixed order, so a (setting, seed) pair
always yields the same file.  Data nodes get the total relay capacity, enough
never to be the bottleneck.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

from ..protocol.scenario import Scenario, parse_scenario


@dataclass(frozen=True)
class FlowSetting:
    data_nodes: int
    relays: int
    stages: int
    capacity: tuple[float, float]
    link_cost: tuple[float, float]


# Table V of the paper (and ../shared/specs/scenario.md).
FLOW_SETTINGS: dict[int, FlowSetting] = {
    1: FlowSetting(1, 40, 8, (1, 3), (1, 20)),
    2: FlowSetting(1, 40, 10, (1, 3), (1, 20)),
    3: FlowSetting(1, 40, 8, (5, 15), (1, 20)),
    4: FlowSetting(1, 40, 8, (1, 3), (5, 100)),
    5: FlowSetting(2, 40, 8, (1, 3), (1, 20)),
    6: FlowSetting(4, 80, 8, (1, 3), (1, 20)),
}


def _floor_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return int(math.floor(rng.uniform(lo, hi)))


def generate_layered(name: str, setting: FlowSetting, seed: int) -> dict:
    """A scenario in the file format (a JSON-ready dict)."""
    rng = random.Random(seed)
    s = setting.stages
    relays = []
    for k in range(setting.relays):
        stage = k % s
        relays.append({"id": f"r{stage}_{k // s}", "role": "relay", "stage": stage,
                       "capacity": _floor_uniform(rng, *setting.capacity)})
    total_cap = sum(r["capacity"] for r in relays)
    data = [{"id": f"d{k}", "role": "data", "capacity": max(1, total_cap)} for k in range(setting.data_nodes)]
    by_stage: list[list[str]] = [[] for _ in range(s)]
    for r in relays:
        by_stage[r["stage"]].append(r["id"])
    links = []

    def link(a: str, b: str) -> None:
        links.append({"a": a, "b": b, "cost": _floor_uniform(rng, *setting.link_cost)})

    for d in data:
        for r in by_stage[0]:
            link(d["id"], r)
    for st in range(s - 1):
        for a in by_stage[st]:
            for b in by_stage[st + 1]:
                link(a, b)
    for r in by_stage[s - 1]:
        for d in data:
            if s == 1 and any(l["a"] == d["id"] and l["b"] == r for l in links):
                continue
            link(r, d["id"])
    return {"name": name, "stages": s, "nodes": data + relays, "links": links}


def flow_setting_scenario(setting: int, seed: int) -> dict:
    if setting not in FLOW_SETTINGS:
        raise ValueError(f"unknown flow setting {setting}: choose one of {sorted(FLOW_SETTINGS)}")
    return generate_layered(f"flow-t{setting}-s{seed}", FLOW_SETTINGS[setting], seed)


def load_flow_setting(setting: int, seed: int) -> Scenario:
    return parse_scenario(flow_setting_scenario(setting, seed))


def delayed_layered(stages: int, per_stage: int, delay_ms: tuple[float, float] | None, seed: int) -> Scenario:
    """One data node and `stages` x `per_stage` relays of capacity 1 (the shape of a daemon swarm's one data node
    with `per_stage` microbatches an iteration), link costs as setting 1's (1-20); each link's one-way delays
    drawn from U(`delay_ms`) with `random.Random(seed)`, unrelated to its cost (a loaded host's event loops), or,
    with None, equal to its cost in milliseconds as in every generated scenario."""
    raw = generate_layered(f"delayed-{stages}x{per_stage}-s{seed}",
                           FlowSetting(1, stages * per_stage, stages, (1, 2), (1, 20)), seed)
    raw["nodes"][0]["capacity"] = per_stage
    if delay_ms is not None:
        rng = random.Random(seed)
        for link in raw["links"]:
            link["latency_ms"] = [rng.uniform(*delay_ms), rng.uniform(*delay_ms)]
    return parse_scenario(raw)


def parse_delay_range(text: str) -> tuple[float, float] | None:
    """A `--delays` argument of the benchmarks over `delayed_layered`: "LO-HI" in milliseconds, or "none" (delays
    equal to the links' costs); `argparse.ArgumentTypeError` with what to give otherwise."""
    if text == "none":
        return None
    try:
        lo, hi = (float(x) for x in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a delay range as LO-HI in milliseconds, or none") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= LO <= HI")
    return lo, hi
