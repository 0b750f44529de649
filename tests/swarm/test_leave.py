"""Graceful leave on real processes: `gwtf-node leave` wastes no work and training goes on.

1 data node, 2 stages x 2 relays train; one relay is asked to leave. It
finishes its microbatches and its last aggregation, says Goodbye and exits;
from the next iteration on nobody routes to it and its stage aggregates
without it. Every iteration still completes all its microbatches and every
loss equals the centralized reference (nothing was lost or counted twice).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gwtf_node.cli import main
from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.local.swarm import LocalSwarm

from support.swarmutil import assert_losses, wait_exit, wait_records

pytestmark = [pytest.mark.slow, pytest.mark.trio]
AFTER = 3  # iterations trained after the leave (the first already routes around the relay that left)


async def test_graceful_leave(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=2, iterations=100000)
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 3, 180)
        rc = await trio.to_thread.run_sync(main, ["leave", "--state-dir", str(tmp_path / "r0_1"), "--timeout", "30"])
        assert rc == 0
        assert swarm.procs["r0_1"].wait(timeout=5) == 0
        left_at = len(swarm.records())
        with trio.fail_after(300):
            while len(swarm.records()) < left_at + AFTER:
                for name, p in swarm.procs.items():
                    assert name == "r0_1" or p.poll() is None, f"{name} died"
                await trio.sleep(0.2)
        before_stop = len(swarm.records())  # the test's own SIGTERM of d0 may close a last, partial iteration
        swarm.procs["d0"].terminate()
        await wait_exit(swarm, "d0", 30)
    finally:
        await trio.to_thread.run_sync(swarm.stop)

    log = (tmp_path / "r0_1" / "node.log").read_text()
    assert "leaving after iteration" in log and "left the run" in log
    assert "leaving anyway" not in log  # it took part in its last aggregation
    assert "r0_1 left after iteration" in (tmp_path / "d0" / "node.log").read_text()
    records = swarm.records()[:before_stop]
    assert len(records) >= left_at + AFTER
    assert all(r["microbatches"] == 4 for r in records), records  # no microbatch lost to the leave
    ref = train_centralized(man, len(records))
    assert_losses(records, ref.losses)
