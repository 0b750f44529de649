"""A data node dies (the leader, or the other one), and a volunteer still joins, given the address of another member.

Lab (gwtf_node/testing/netlab.py): two data nodes d0 (everyone's bootstrap)
and d1, one relay per stage, each in its own namespace on the internet
segment.  Once the swarm trains, one data node is SIGKILLed: the leader (in
these runs d0, the bootstrap: the node the others first dialled is gone), or
the other one.  The survivor trains on (with two data nodes a relay is the
election's third voter, leader.py: a survivor that was not the leader takes
over), the others presume the dead one gone.  Then a relay j0 starts with
`--stage auto` and `--bootstrap` the address of r0_0: it finds the run, the
leader places it, it downloads its stage's state and steps with its stage
(it computes microbatches when the flows need it: with one data node left,
r0_0 can carry them all) while the run goes on.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from support import labutil
import pytest
from support.swarmutil import log_digest, status

from gwtf_node.model.manifest import default_manifest, save_manifest

pytestmark = [pytest.mark.netlab, pytest.mark.multiprocess, pytest.mark.slow]
lab = labutil.lab  # the fixture

MAX_ITERATIONS = 2000  # stopped once j0 computed and two more iterations settled
JOINED_WITHIN_S = 150.0


@pytest.mark.parametrize("victim", ["leader", "other"])
def test_a_relay_joins_through_another_member_after_a_data_node_died(lab, tmp_path: Path, victim: str) -> None:
    man = default_manifest(family="llama", stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    names = ["d0", "d1", "r0_0", "r1_0", "j0"]
    swarm, where = labutil.public_swarm(lab, tmp_path, run, names, data_nodes=2, stages=2, relays_per_stage=1,
                                        iterations=MAX_ITERATIONS)
    records: list[dict] = []
    killed_at = started_at = joined = placed_steps = None
    try:
        swarm.start()
        for rec in swarm.iterations_done():
            records.append(rec)
            if killed_at is None:
                leader = status(tmp_path, "d0").get("leader")
                if len(records) >= 2 and leader:
                    lead = next(n for n in ("d0", "d1") if status(tmp_path, n).get("peer_id") == leader)
                    dead = lead if victim == "leader" else ({"d0", "d1"} - {lead}).pop()
                    swarm.expected_dead.add(dead)
                    os.killpg(swarm.procs[dead].pid, signal.SIGKILL)
                    assert swarm.procs[dead].wait(timeout=10) == -9
                    killed_at = len(records)
                continue
            if started_at is None:
                if len(records) >= killed_at + 2:  # the survivor trains on alone
                    via = (tmp_path / "r0_0" / "addr").read_text().split()[0]
                    swarm.add_relay("j0", bootstrap=via)
                    started_at = time.monotonic()
                continue
            if joined is None:
                st = status(tmp_path, "j0")
                if st.get("stage") is not None and not st.get("joining"):
                    placed_steps = placed_steps if placed_steps is not None else st.get("steps_applied", 0)
                    if st.get("steps_applied", 0) >= placed_steps + 2:  # it steps with its stage
                        joined = len(records)
                if joined is None:
                    assert time.monotonic() - started_at < JOINED_WITHIN_S, (
                        f"j0 not stepping with its stage {JOINED_WITHIN_S:.0f} s after it started", st.get("state"),
                        log_digest(tmp_path, where))
            elif len(records) >= joined + 2:
                break
    finally:
        swarm.stop()
    assert joined is not None, (records, log_digest(tmp_path, where))
    assert all(r["microbatches"] > 0 for r in records), records
