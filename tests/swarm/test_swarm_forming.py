"""A swarm forming from scratch, every relay started with `--stage auto` at once, on real processes.

1 data node and 4 relays for 2 stages, the relays started together without
waiting for each other: the leader's first round with candidates holds one
for every stage and nobody serves yet, so it places them as a whole
(protocol/swarmplace.py, via `MembershipMachine._place`), every stage from
the run's initial weights.  Must hold: the leader says so; every relay is
assigned from the initial weights and serves; both stages are held; the
losses equal centralized training.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.local.swarm import LocalSwarm

from support.swarmutil import assert_losses, log_text, wait_records

pytestmark = [pytest.mark.slow, pytest.mark.trio]
ITERATIONS = 4
RELAYS = [f"r{k}_{i}" for k in range(2) for i in range(2)]


async def test_relays_started_together_are_placed_as_a_whole(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    # `--stage auto` after the stage LocalSwarm gives: the last flag wins, and nobody waits for a stage first
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=2, iterations=ITERATIONS,
                       extra_args={r: ["--stage", "auto"] for r in RELAYS})
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, ITERATIONS, 180)
    finally:
        await trio.to_thread.run_sync(swarm.stop)
    placed = [int(n) for n in re.findall(r"placed (\d+) relay\(s\) as a whole swarm", log_text(tmp_path, "d0"))]
    assert placed and placed[0] >= 2, log_text(tmp_path, "d0")[-3000:]  # at least one candidate per stage
    stages = {}
    for r in RELAYS:
        text = log_text(tmp_path, r)
        got = re.findall(r"assigned to stage (\d) by the leader \(term \d+\); state from (.+?), serving", text)
        assert got, text[-2000:]
        stages[r] = int(got[0][0])
        assert json.loads((tmp_path / r / "status.json").read_text())["stage"] == stages[r]
    # those placed as a whole start from the initial weights; at least one relay serves each stage
    assert sum(1 for r in RELAYS if "state from the run's initial weights" in log_text(tmp_path, r)) >= placed[0]
    assert set(stages.values()) == {0, 1}, stages
    ref = train_centralized(man, ITERATIONS)
    assert_losses(swarm.records()[:ITERATIONS], ref.losses)
