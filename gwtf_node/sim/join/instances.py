"""The node-addition instances of Table IV: the running system, the candidates, every link cost.

The package docstring (gwtf_node/sim/join/__init__.py) says how the paper's
experiment is read; this module draws it: every number is floor(U(lo, hi)),
a link's cost is drawn once per pair of machines, and phi is the largest
inter-stage cost of a node for a stage.

The system.  One data node d0 and 96 relays (97 nodes) spread over S stages,
plus 20 candidates waiting to join (the paper's "97 nodes" are the running
system: (N-1)/S relays per stage is 12 for S = 8 and 8 for S = 12; the 20
candidates come on top).  Per Table IV, every number is floor(U(lo, hi)):

| setting | S  | capacity | inter-stage cost | intra-stage cost      | relays per stage |
|---------|----|----------|------------------|-----------------------|------------------|
| 1       | 8  | U(1,20)  | U(1,100)         | phi + U(50,100)       | 12               |
| 2       | 8  | U(1,20)  | U(20,100)        | phi + U(50,100)       | 12               |
| 3       | 8  | U(1,5)   | U(1,100)         | phi + U(50,100)       | 12               |
| 4       | 12 | U(1,20)  | U(1,100)         | phi + U(50,100)       | 8                |
| 5*      | 8  | U(1,20)  | U(1,100)         | phi + U(50,100)       | random, >= 1 each    |

Every relay links to every relay of the next stage, d0 to every relay of the
first and the last stage (as in the flow tests).  A link is one physical pair
of machines, so its cost is drawn once: a candidate has one cost to every
existing node and to every other candidate, and uses those of its stage's
neighbours (stages s-1 and s+1, d0 at the ends) wherever it is placed; that
is what "each node knows its costs for each stage" means.  phi (Table IV) is
the largest inter-stage cost of a node for the stage it is in or proposed for;
its intra-stage cost for that stage is phi + floor(U(50,100)).  The data node's
capacity is the total capacity of everyone: it is never the bottleneck.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

CANDIDATES = 20
SYSTEM_NODES = 97  # data node included


@dataclass(frozen=True)
class JoinSetting:
    stages: int
    capacity: tuple[int, int]
    inter_cost: tuple[int, int]
    intra_extra: tuple[int, int] = (50, 100)
    random_stage_sizes: bool = False


# Table IV of the paper (top half).
JOIN_SETTINGS: dict[int, JoinSetting] = {
    1: JoinSetting(8, (1, 20), (1, 100)),
    2: JoinSetting(8, (1, 20), (20, 100)),
    3: JoinSetting(8, (1, 5), (1, 100)),
    4: JoinSetting(12, (1, 20), (1, 100)),
    5: JoinSetting(8, (1, 20), (1, 100), random_stage_sizes=True),
}


@dataclass(frozen=True)
class JoinInstance:
    """The running system, the candidates and every link cost (a snapshot the leader could hold)."""

    name: str
    stages: int
    relay_stage: dict[str, int]
    relay_cap: dict[str, int]
    relay_intra: dict[str, int]
    candidates: tuple[str, ...]
    cand_cap: dict[str, int]
    cand_intra: dict[tuple[str, int], int]  # (candidate, stage) -> intra-stage cost there
    link: dict[tuple[str, str], int]  # sorted pair -> cost; d0 is the data node
    data: str = "d0"

    def cost(self, a: str, b: str) -> int:
        return self.link[(a, b) if a < b else (b, a)]

    def stage_members(self, s: int) -> list[str]:
        return sorted(r for r, st in self.relay_stage.items() if st == s)

    def neighbours_of_stage(self, s: int) -> list[str]:
        """Existing nodes adjacent to stage s: stage s-1 (or d0) and s+1 (or d0)."""
        prev = [self.data] if s == 0 else self.stage_members(s - 1)
        nxt = [self.data] if s == self.stages - 1 else self.stage_members(s + 1)
        return sorted(set(prev) | set(nxt))

    def stage_caps(self, assign: tuple[int, ...] = ()) -> list[int]:
        caps = [0] * self.stages
        for r, s in self.relay_stage.items():
            caps[s] += self.relay_cap[r]
        for v, s in zip(self.candidates, assign):
            caps[s] += self.cand_cap[v]
        return caps

    def join_delay(self, assign: tuple[int, ...]) -> int:
        return max((self.cand_intra[(v, s)] for v, s in zip(self.candidates, assign)), default=0)


def _floor_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.floor(rng.uniform(lo, hi)))


def generate_join(setting: int, seed: int, *, relays: int = SYSTEM_NODES - 1,
                  candidates: int = CANDIDATES, stages: int | None = None) -> JoinInstance:
    """The instance of (setting, seed); `relays`, `candidates`, `stages` shrink it for tests."""
    if setting not in JOIN_SETTINGS:
        raise ValueError(f"unknown join setting {setting}: choose one of {sorted(JOIN_SETTINGS)}")
    st = JOIN_SETTINGS[setting]
    s_count = stages if stages is not None else st.stages
    if relays < s_count:
        raise ValueError(f"{relays} relays cannot fill {s_count} stages")
    rng = random.Random(f"join-{setting}-{seed}")
    if st.random_stage_sizes:  # a random composition of `relays` into S positive parts
        cuts = sorted(rng.sample(range(1, relays), s_count - 1))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, relays])]
    else:
        sizes = [relays // s_count + (1 if k < relays % s_count else 0) for k in range(s_count)]
    relay_stage: dict[str, int] = {}
    relay_cap: dict[str, int] = {}
    for s, n in enumerate(sizes):
        for k in range(n):
            rid = f"r{s}_{k}"
            relay_stage[rid] = s
            relay_cap[rid] = _floor_uniform(rng, *st.capacity)
    by_stage = [[r for r in relay_stage if relay_stage[r] == s] for s in range(s_count)]
    link: dict[tuple[str, str], int] = {}

    def draw(a: str, b: str) -> None:
        key = (a, b) if a < b else (b, a)
        if key not in link:
            link[key] = _floor_uniform(rng, *st.inter_cost)

    for r in by_stage[0] + by_stage[-1]:
        draw("d0", r)
    for s in range(s_count - 1):
        for a in by_stage[s]:
            for b in by_stage[s + 1]:
                draw(a, b)
    cands = tuple(f"c{k:02d}" for k in range(candidates))
    cand_cap = {v: _floor_uniform(rng, *st.capacity) for v in cands}
    for v in cands:
        for other in ("d0", *relay_stage):
            draw(v, other)
    for v, w in itertools.combinations(cands, 2):
        draw(v, w)

    def phi(node: str, s: int) -> int:
        prev = ["d0"] if s == 0 else by_stage[s - 1]
        nxt = ["d0"] if s == s_count - 1 else by_stage[s + 1]
        return max(link[(node, o) if node < o else (o, node)] for o in (*prev, *nxt) if o != node)

    relay_intra = {r: phi(r, relay_stage[r]) + _floor_uniform(rng, *st.intra_extra) for r in relay_stage}
    cand_intra = {(v, s): phi(v, s) + _floor_uniform(rng, *st.intra_extra) for v in cands for s in range(s_count)}
    return JoinInstance(f"join-t{setting}-s{seed}", s_count, relay_stage, relay_cap, relay_intra, cands,
                        cand_cap, cand_intra, link)


def to_scenario(inst: JoinInstance, assign: tuple[int, ...] = ()) -> dict:
    """The system after `assign`, in the scenario file format (specs/scenario.md), to replay or cross-check.

    Only the links a microbatch can use are written; intra-stage costs have no
    place in that format and are left out.
    """
    stage = dict(inst.relay_stage)
    stage.update({v: s for v, s in zip(inst.candidates, assign)})
    cap = dict(inst.relay_cap)
    cap.update(inst.cand_cap)
    nodes = [{"id": inst.data, "role": "data", "capacity": sum(cap.values())}]
    nodes += [{"id": r, "role": "relay", "stage": stage[r], "capacity": cap[r]} for r in sorted(stage)]
    by_stage = [sorted(r for r in stage if stage[r] == s) for s in range(inst.stages)]
    links = [{"a": inst.data, "b": r, "cost": inst.cost(inst.data, r)} for r in by_stage[0]]
    for s in range(inst.stages - 1):
        links += [{"a": a, "b": b, "cost": inst.cost(a, b)} for a in by_stage[s] for b in by_stage[s + 1]]
    links += [{"a": r, "b": inst.data, "cost": inst.cost(r, inst.data)} for r in by_stage[-1]
              if inst.stages > 1]
    return {"name": inst.name, "stages": inst.stages, "nodes": nodes, "links": links}

