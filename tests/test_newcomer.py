"""A volunteer joins a training run in flight, on real processes.

1 data node and 2 stages x 1 relay train; a new relay starts with `--stage
auto` while they do. The leader places it, it downloads its stage's weights
and optimizer state from the stage's relay (SHA-256 checked) and takes part
in the aggregations from the next iteration boundary on. The run is not
disturbed: every iteration's loss equals the centralized reference, and at
the end the newcomer's parameters equal its stage peer's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.local import LocalSwarm

from swarmutil import status, wait_exit, wait_for, wait_records

pytestmark = [pytest.mark.slow, pytest.mark.trio]
AFTER_JOIN = 5  # iterations the newcomer takes part in before the run is stopped


async def test_newcomer_joins_mid_run(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=100000)
    newlog = tmp_path / "new" / "node.log"
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 3, 180)
        swarm.add_relay("new")
        with trio.fail_after(240):
            while "taking part from iteration" not in (newlog.read_text() if newlog.exists() else ""):
                swarm._check_alive()
                await trio.sleep(0.2)
            joined_at = int(newlog.read_text().split("taking part from iteration ")[-1].split()[0])
        await wait_records(swarm, joined_at + AFTER_JOIN, 120)
        # stop the data node first: no new iteration opens, the aggregation in flight completes
        swarm.procs["d0"].terminate()
        await wait_exit(swarm, "d0", 30)
        stage = status(tmp_path, "new")["stage"]
        await wait_for(lambda: status(tmp_path, "new").get("steps_applied")
                       == status(tmp_path, f"r{stage}_0").get("steps_applied"), 30, "the newcomer steps with its peer")
    finally:
        await trio.to_thread.run_sync(swarm.stop)

    log = newlog.read_text()
    assert "assigned to stage" in log and "state loaded from" in log, log[-2000:]
    assert joined_at >= 3
    new = torch.load(tmp_path / "new" / "checkpoint.pt", weights_only=False)
    peer = torch.load(tmp_path / f"r{new['stage']}_0" / "checkpoint.pt", weights_only=False)
    last = peer["steps"] - 1  # the last iteration stepped
    assert last >= joined_at + AFTER_JOIN - 1
    assert new["steps"] == peer["steps"]  # it stepped with its stage to the end
    assert torch.equal(new["params"], peer["params"])  # bit for bit: same state, same all-reduced update

    records = swarm.records()[: last + 1]
    # (the record of the last step may be missing: the data node was stopped while that aggregation ran)
    assert len(records) >= last, (len(records), last)
    ref = train_centralized(man, len(records))
    assert [r["loss"] for r in records] == pytest.approx(ref.losses, rel=1e-4)  # the join did not disturb training
