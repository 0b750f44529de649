"""A relay that joins after a paused stage came back: the run trains on, and nothing waits silently.

1 data node; stage 0: r0_0 and r0_2; stage 1: r1_0.  After 2 iterations r0_2
leaves (`gwtf-node leave`); once it is gone, r0_0 is armed (a `fault` file
in its state directory) to kill itself with SIGKILL as its next backward
starts (so that the kill never falls between its all-reduce and its step,
and never before r0_2 is gone, however long the leave takes on a loaded
machine): stage 0 is empty, the data node pauses
and says so in `waiting_for`.  r0_0 comes back with its state directory and
the run resumes.  Then a new relay joins stage 1 (`--stage 1`, a fresh state
directory): the leader may count it in the next aggregation before stage 0's
relay has heard of it, and stage 0 must still pass BEGIN AGGREGATION to it
and wait for its CAN TAKE (protocol/phases.py, "Who passes a signal on").
The run reaches 4 more iterations, numbered without a gap, every loss equal
to the centralized reference trained on what the logs say each iteration
trained (restartutil.py), and every node's status.json says what it waits
for (`waiting_for`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local.swarm import LocalSwarm

from support.restartutil import reference_losses, restart, stage_plan
from support.swarmutil import log_digest, status, wait_exit, wait_for, wait_records

M = 2  # microbatches per iteration


@pytest.mark.slow
@pytest.mark.trio
async def test_relay_joining_after_a_pause_trains_on(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=M)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=100000,
                       iteration_timeout_s=60, log_level="DEBUG")
    try:
        await trio.to_thread.run_sync(swarm.start)
        swarm.add_relay("2", auto=False, stage=0)
        await wait_records(swarm, 2, 120)
        leave = [sys.executable, "-m", "gwtf_node.cli", "leave", "--state-dir", str(tmp_path / "r0_2")]
        await trio.to_thread.run_sync(lambda: subprocess.run(leave, capture_output=True, timeout=60))
        assert await wait_exit(swarm, "r0_2", 30) == 0
        assert swarm.procs["r0_0"].poll() is None, "r0_0 died before r0_2 left"
        swarm.expected_dead.add("r0_0")
        (tmp_path / "r0_0" / "fault").write_text("backward:1")
        assert await wait_exit(swarm, "r0_0", 120) == -9, "the fault did not fire"
        paused = await wait_for(lambda: status(tmp_path, "d0").get("paused"), 60, "the data node pauses", swarm)
        assert paused["empty_stages"] == [0], paused
        waits = await wait_for(lambda: status(tmp_path, "d0").get("waiting_for"), 10, "d0 says it waits", swarm)
        assert any(w["what"] == "paused_stage" and w["stages"] == [0] for w in waits), waits
        restart(swarm, "r0_0")
        try:
            n = len(await wait_records(swarm, len(swarm.records()) + 3, 90))
            swarm.add_relay("3", auto=False, stage=1)
            await wait_records(swarm, n + 4, 90)
        except AssertionError as e:
            waits = {name: status(tmp_path, name).get("waiting_for") for name in swarm.procs}
            raise AssertionError(f"{e}; waiting_for: {waits}\n"
                                 f"{log_digest(tmp_path, list(swarm.procs))}") from None
        for name in ("d0", "r0_0", "r1_0", "r1_3"):  # (r1_3 may still be starting on a loaded machine)
            await wait_for(lambda: isinstance(status(tmp_path, name).get("waiting_for"), list), 120,
                           f"{name}'s status.json saying what it waits for", swarm)
    finally:
        await trio.to_thread.run_sync(swarm.stop)
    records = swarm.records()
    assert [r["iteration"] for r in records] == list(range(len(records)))
    plan = stage_plan(tmp_path, 1, {0: ["r0_0", "r0_2"], 1: ["r1_0", "r1_3"]})
    want = reference_losses(man, 1, plan[:len(records)])
    for r, (data_keys, _stages), loss in zip(records, plan, want):
        assert r["microbatches"] == len(data_keys), (r, data_keys)
        if loss is None:
            assert r["loss"] is None, r
        else:
            assert r["loss"] == pytest.approx(loss, rel=1e-4), (r, loss)
