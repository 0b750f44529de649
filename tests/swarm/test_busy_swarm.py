"""A relay whose optimizer step takes longer than the liveness floor is busy, not dead.

1 data node and 2 stages x 1 relay train, separate processes on loopback.
Relay r1_0 does BUSY_S seconds of real work (matrix products in its torch
worker thread, fault injection `busy_step`, faults.py) in each of its steps,
longer than the 6 s after which a silent peer is presumed dead: the way the
step of a large model or the write of its checkpoint keeps a node busy.  Its
event loop keeps answering pings meanwhile, so nobody is presumed dead,
every iteration completes all its microbatches, and the relay widens the
deadline it gives its own peers to twice the work it measured
(liveness.py, `dead_after_s`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.node import liveness
from gwtf_node.runtime.local.swarm import LocalSwarm, run_local

pytestmark = pytest.mark.slow
ITERATIONS = 2
BUSY_S = liveness.DEAD_AFTER_S + 3.0


def test_a_relay_busy_stepping_beyond_the_deadline_floor_is_not_presumed_dead(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    (tmp_path / "r1_0").mkdir(parents=True)
    (tmp_path / "r1_0" / "busy_step").write_text(str(BUSY_S))  # this relay's fault injection
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=ITERATIONS,
                       iteration_timeout_s=120)
    records = run_local(swarm, lambda rec: None)

    assert [r["iteration"] for r in records] == list(range(ITERATIONS))
    for r in records:
        assert r["completed"] == r["microbatches"] == 2 and r["lost"] == 0 and r["deferred"] == 0, r
    logs = {n: (tmp_path / n / "node.log").read_text() for n in ("d0", "r0_0", "r1_0")}
    assert "GWTF_BUSY_STEP" in logs["r1_0"], "the fault did not fire"
    for name, text in logs.items():
        assert "presumed dead" not in text, (name, [ln for ln in text.splitlines() if "presumed dead" in ln])
        assert "forgetting it too" not in text, name
    busy = json.loads((tmp_path / "r1_0" / "status.json").read_text())
    assert busy["work_s"]["busy_step"] >= BUSY_S
    assert liveness.dead_after_s(0.0, busy["work_s"]["busy_step"]) >= 2 * BUSY_S
    d0 = json.loads((tmp_path / "d0" / "status.json").read_text())
    assert d0["presumed_dead"] == [] and busy["presumed_dead"] == []
