"""Bounded fan-out: which peers a node connects to, and where in the DHT it looks for them.

A relay of stage k works with the relays of stages k-1, k and k+1 (its flows'
neighbours, its all-reduce group, the peers it lends to) and with the data
nodes (its flows' source and sink at the ends of the pipeline, the leader,
the voters); nothing it does reaches a relay two stages away.  So it dials
only those (`works_with`), and the peers it hears of are passed on only to
the peers that work with them (discovery.py): its connections grow with the
size of three stages, not of the swarm.

A data node connects to every node: the leader queries every stage member
for its utilization and places every newcomer, and any data node may become
leader.  Data nodes are the run's few fixed machines (three in the GWTF
paper's Table VI), the relays its many volunteers.

A relay not placed yet (a candidate, `--stage auto`) dials the data nodes
and a sample of `SAMPLE_PER_STAGE` members of each stage: it measures its
cost to each stage from their round trips (the `JoinRequest` the leader
places it by).  Once placed, it dials its new neighbours.

Where a node looks in the DHT (`provider_keys`): every node provides the run
key; data nodes also provide `run/<id>/data`, relays `run/<id>/stage/<k>`.
A data node looks at the run key's providers (everyone); a relay at the data
nodes' key and the keys of the stages it works with (all stages while it is
not placed), so it never reads the node record of a peer it will not dial.

`degrees` applies the rule to a whole swarm: the connections per node that
`scripts/bench_fanout.py` reports for swarms of 50 and more nodes.
"""

from __future__ import annotations

from typing import Iterable, Sequence

DATA = "data"
UNPLACED = -2  # a relay's stage before the leader placed it (its Hello says -2)
SAMPLE_PER_STAGE = 2  # members of each stage an unplaced relay dials to measure its cost to that stage


def _placed(stage: int | None) -> bool:
    return stage is not None and stage >= 0


def works_with(role: str, stage: int | None, other_role: str, other_stage: int | None) -> bool:
    """Whether a node (`role`, `stage`) dials a peer (`other_role`, `other_stage`) it hears of (module doc).
    An unplaced relay's sample of stage members is not decided here (`wants_sample`)."""
    if role == DATA or other_role == DATA:
        return True
    if not _placed(stage) or not _placed(other_stage):
        return False
    return abs(other_stage - stage) <= 1


def wants_sample(role: str, stage: int | None, other_role: str, other_stage: int | None, known_in_stage: int) -> bool:
    """An unplaced relay dials a member of a stage while it knows fewer than `SAMPLE_PER_STAGE` there."""
    return role != DATA and not _placed(stage) and other_role != DATA and _placed(other_stage) \
        and known_in_stage < SAMPLE_PER_STAGE


def provider_keys(run_id: str, role: str, stage: int | None, n_stages: int) -> list[str]:
    """The DHT keys whose providers this node looks at for peers to dial (module doc)."""
    run_key = f"run/{run_id}"
    if role == DATA:
        return [run_key]
    stages = range(n_stages) if not _placed(stage) else range(max(0, stage - 1), min(n_stages, stage + 2))
    return [f"{run_key}/data"] + [f"{run_key}/stage/{k}" for k in stages]


def provided_keys(run_id: str, role: str, stage: int | None) -> list[str]:
    """The DHT keys this node provides: the run key, and its role's key (the data nodes', or its stage's)."""
    run_key = f"run/{run_id}"
    if role == DATA:
        return [run_key, f"{run_key}/data"]
    return [run_key] + ([f"{run_key}/stage/{stage}"] if _placed(stage) else [])


def degrees(nodes: Sequence[tuple[str, str, int | None]]) -> dict[str, int]:
    """Connections per node of a swarm whose nodes (id, role, stage) all follow the rule: a connection exists
    when either end dials the other (an unplaced relay's sample: the first members of each stage by id)."""
    ids = [n[0] for n in nodes]
    links: set[tuple[str, str]] = set()
    by_stage: dict[int, list[str]] = {}
    for nid, role, stage in nodes:
        if role != DATA and _placed(stage):
            by_stage.setdefault(stage, []).append(nid)
    for i, (a, ra, sa) in enumerate(nodes):
        for b, rb, sb in nodes[i + 1:]:
            if works_with(ra, sa, rb, sb) or works_with(rb, sb, ra, sa):
                links.add((a, b) if a < b else (b, a))
        if ra != DATA and not _placed(sa):
            for members in by_stage.values():
                for b in sorted(members)[:SAMPLE_PER_STAGE]:
                    links.add((a, b) if a < b else (b, a))
    out = dict.fromkeys(ids, 0)
    for a, b in links:
        out[a] += 1
        out[b] += 1
    return out


def full_mesh_degrees(ids: Iterable[str]) -> dict[str, int]:
    """Connections per node when every node dials every other (what the rule replaces)."""
    ids = list(ids)
    return dict.fromkeys(ids, len(ids) - 1)
