"""A relay cut off for 30 s comes back: redialled, caught up to its stage's parameters, training again.

Lab (gwtf_node/testing/netlab.py): d0 and two relays per stage, each in its
own namespace on the internet segment, 60 ms between any two (the daemon's
link emulation); each relay holds half of d0's units.  Once a few iterations
settled, the uplink of r0_1 goes down for 30 s (a partition: its packets are
dropped, its TCP connections stall).  Both sides presume each other dead
after 6 s (liveness.py) and close their connections; d0 trains on with r0_0
alone.  When the link is back, the redial loops (discovery.py) greet each
other again; r0_1 hears that the run stepped past its state and fetches the
state after those steps from r0_0 (`Joining.catch_up`); d0's flows place
units on it again (`FlowNode.peer_back`) and it carries microbatches again, and from then on both stage-0 relays hold the same
parameters after every step (their checkpoints' parameter hashes, from the last state either loaded: copies that
stepped apart in rounds of their own are compared and one of them repaired, cutcheck.py).  Every
iteration completes its 4 microbatches; the losses equal the centralized
reference until the cut.  After it they need not: a relay cut off while it
holds gradient contributions of the iteration in flight is a crash for that
iteration's aggregation (its contributions are lost, docs/architecture.md
"Crashes in the daemon"), so the run's step differs from the centralized one from there on.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from support import labutil
import pytest
from support.swarmutil import log_digest, log_text, status

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.node import checkpoints

pytestmark = [pytest.mark.netlab, pytest.mark.multiprocess, pytest.mark.slow]
lab = labutil.lab  # the fixture

MAX_ITERATIONS = 2000  # the run is stopped once r0_1 computed again after catching up, and two more iterations settled
CUT_S = 30.0
BACK_WITHIN_S = 150.0  # from the restore to r0_1 computing again (redial backoff, state download)


def _units_on(st: dict, peer: str) -> int:
    """Units of the data node's own demand it sends to `peer` (status.json `flows`)."""
    return (st.get("flows") or {}).get(st["peer_id"], {}).get(peer, 0)


def test_a_relay_partitioned_for_30_s_comes_back_and_trains(lab, tmp_path: Path) -> None:
    man = default_manifest(family="llama", stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    names = ["d0", "r0_0", "r0_1", "r1_0", "r1_1"]
    # 60 ms links (the daemon's own emulation): an iteration takes about a second instead of a third, so the run
    # stays at a few dozen iterations; over a hundred or more, the loss drifts from the centralized one past 1e-4 by
    # float rounding alone (a stage sums its microbatches' gradients in the order they complete)
    links = tmp_path / "links-60ms.json"
    links.write_text(json.dumps({"links": [{"a": a, "b": b, "latency_ms": 60.0, "bandwidth_mbps": 1000.0}
                                           for a in names for b in names if a != b]}))
    swarm, where = labutil.public_swarm(lab, tmp_path, run, names, data_nodes=1, stages=2, relays_per_stage=2,
                                        iterations=MAX_ITERATIONS, links=links,
                                        extra={n: ["--keep-checkpoints", "10000"] for n in ("r0_0", "r0_1")})
    records: list[dict] = []
    cut_at = restored_at = back = routed = None
    try:
        swarm.start()
        for rec in swarm.iterations_done():
            records.append(rec)
            if cut_at is None:
                if len(records) >= 3:
                    lab.cut(where["r0_1"])
                    cut_at, cut_after = time.monotonic(), len(records)
                continue
            if restored_at is None:
                if time.monotonic() - cut_at >= CUT_S:
                    lab.restore(where["r0_1"])
                    restored_at = time.monotonic()
                continue
            if back is None:
                st = status(tmp_path, "r0_1")
                if routed is None and not st.get("joining") and _units_on(status(tmp_path, "d0"), st["peer_id"]):
                    routed = st.get("compute_calls", 0)  # d0's flows use r0_1 again (its profile counts calls too)
                if routed is not None and st.get("compute_calls", 0) > routed:
                    back = len(records)
                else:
                    assert time.monotonic() - restored_at < BACK_WITHIN_S, (
                        f"r0_1 not computing {BACK_WITHIN_S:.0f} s after its link came back: {st.get('state')}",
                        log_digest(tmp_path, where))
            elif len(records) >= back + 2:
                break
    finally:
        swarm.stop()
    print("records", json.dumps(records))
    assert back is not None, (records, log_digest(tmp_path, where))
    d0_log, r_log = log_text(tmp_path, "d0"), log_text(tmp_path, "r0_1")
    assert "peer r0_1 presumed dead" in d0_log and "peer r0_1 is back" in d0_log
    assert "behind the run" in r_log, r_log[-3000:]
    assert [r["iteration"] for r in records] == list(range(len(records)))
    assert all(r["microbatches"] == 4 and math.isfinite(r["loss"]) for r in records), log_digest(tmp_path, where)
    ref = train_centralized(man, cut_after, data_nodes=1)
    for rec, loss in zip(records[:cut_after], ref.losses):
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)
    assert re.search(r"stage 0 state loaded from r0_0 \((\d+) steps", r_log), r_log[-3000:]
    # from the last state either stage-0 relay loaded (the catch-up, or a repair of copies that stepped apart in
    # rounds of their own: cutcheck.py, logged), both hold the same parameters after every step
    loads = [int(n) for r in ("r0_0", "r0_1")
             for n in re.findall(r"stage 0 state loaded from \S+ \((\d+) steps", log_text(tmp_path, r))]
    loaded = max(loads)
    hashes = [{ck.steps: ck.params_sha256 for ck in map(checkpoints.load, checkpoints.listing(tmp_path / r))}
              for r in ("r0_0", "r0_1")]
    both = sorted(s for s in set(hashes[0]) & set(hashes[1]) if s >= loaded)
    assert len(both) >= 2, (loads, sorted(hashes[0])[-5:], sorted(hashes[1])[-5:])
    apart = [s for s in both if hashes[0][s] != hashes[1][s]]
    assert not apart, (f"stage 0's copies differ after {apart} steps (loads {loads})",
                        log_digest(tmp_path, ["r0_0", "r0_1", "d0"], limit=4000))
