"""A member that BEGIN AGGREGATION names while its state is out of step (runtime/node/aggregation.py `abstain`).

In one process: d0, two relays of stage 0 and one of stage 1 (`Node.run`
tasks over real libp2p).  Once r0_1 has applied the step of iteration 0, its
phases machine is put one step ahead (what a newcomer ends with when it
loaded the state after a step while the aggregation of that step still ran),
so the BEGIN of iteration 1 finds it out of step.  It takes part in its
stage's all-reduce with nothing (a zero sum and count), takes no step, and
fetches the state after that step from r0_0; the run goes on without its
stage-mate waiting the all-reduce's two 120 s rounds for it, and both copies
of stage 0 end equal.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest

from support.helpers import until
from support.inproc import in_process_swarm

pytestmark = [pytest.mark.slow, pytest.mark.trio]

ITERATIONS = 4


async def test_an_out_of_step_member_abstains_resyncs_and_holds_its_stage_mates_state(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    async with in_process_swarm(tmp_path, run, stages=2, relays_per_stage=2, iterations=ITERATIONS,
                                deadline_s=300) as swarm:
        await swarm.start()
        behind, mate = swarm.nodes["r0_1"], swarm.nodes["r0_0"]
        await until(lambda: behind.parts.aggregation.phases is not None
                    and behind.parts.aggregation.phases.applied == 1, "r0_1 steps iteration 0", 120, poll_s=0.02)
        phases = behind.parts.aggregation.phases
        phases.applied = 2  # ahead of iteration 1, whose BEGIN comes next
        # without `abstain`, r0_0's all-reduce of iteration 1 would wait for r0_1 twice 120 s
        records = await swarm.wait_records(ITERATIONS, 150)
        assert [r["iteration"] for r in records] == list(range(ITERATIONS))
        assert all(r["loss"] is not None and math.isfinite(r["loss"]) for r in records), records
        assert phases.stats.out_of_step == 1
        assert behind.parts.aggregation.phases is phases  # (the same machine throughout)
        await until(lambda: behind.stage.model.state_hash() == mate.stage.model.state_hash(),
                    "both copies of stage 0 hold the same parameters", 60)
