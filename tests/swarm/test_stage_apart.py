"""Two copies of a stage that stepped apart are repaired: the one that ranks lower downloads the other's.

1 data node, 2 stages x 2 relays.  Both stage-0 relays are armed to sum
iteration 3 each in a round of its own (`GWTF_ALONE_AT`, faults.py), as two
members that took each other for gone do: each steps on its own
contributions, and their parameters part.  Each finds, after its step, that
the round left out a member BEGIN named, asks it for its steps, parameter
hash and round records, and both reach one verdict (protocol/roundcheck.py):
the copy whose round held more contributions (then the smaller member list)
is kept, the other node downloads it.  From that download on, both hold the
same parameters after every step (their checkpoints' parameter hashes), and
no microbatch is lost (one the download keeps from its relay is deferred to
the next iteration).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from support.swarmutil import log_text

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.node import checkpoints
from gwtf_node.runtime.local.swarm import LocalSwarm, run_local

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

APART_AT = 3
ITERATIONS = 9


def test_two_copies_that_stepped_apart_are_repaired(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    relays = ("r0_0", "r0_1")
    for r in relays:
        (tmp_path / r).mkdir(parents=True, exist_ok=True)
        (tmp_path / r / "alone_at").write_text(str(APART_AT))  # this relay's fault injection
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=2, iterations=ITERATIONS,
                       iteration_timeout_s=120, extra_args={r: ["--keep-checkpoints", "1000"] for r in relays})
    records = run_local(swarm, lambda rec: None)
    assert [r["iteration"] for r in records] == list(range(ITERATIONS))
    # nothing lost: a microbatch the download kept from a relay is deferred to the next iteration, not dropped
    assert all(r["lost"] == 0 and math.isfinite(r["loss"]) for r in records), records
    assert sum(r["microbatches"] for r in records) + records[-1]["deferred"] == 4 * ITERATIONS, records
    ref = train_centralized(man, APART_AT + 1)
    for rec, loss in zip(records[:APART_AT + 1], ref.losses):  # (the step of APART_AT is the first apart)
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)

    logs = {r: log_text(tmp_path, r) for r in relays}
    ids = {r: json.loads((tmp_path / r / "status.json").read_text())["peer_id"] for r in relays}
    held = {}
    for r in relays:
        assert "fault injection GWTF_ALONE_AT" in logs[r], logs[r][-3000:]
        found = re.search(rf"iteration {APART_AT}: summed in round \S+ contributions (\[.*\]);", logs[r])
        held[r] = len(json.loads(found.group(1)))
    fetched = [r for r in relays if re.search(r"differ from \S+ \(parted at \d+ steps.*fetching its state", logs[r])]
    kept = [r for r in relays if re.search(r"differ from \S+ \(parted at \d+ steps\): this copy is kept", logs[r])]
    assert len(fetched) == 1, {r: logs[r][-3000:] for r in relays}
    (loser,), (winner,) = fetched, [r for r in relays if r not in fetched]
    assert kept in ([winner], []), kept  # (the winner may have found its copy already taken over: "checked")
    # the rank (roundcheck.py): more contributions, then the smaller member list (a round of one: the peer id)
    assert (held[winner], -len(ids[winner])) >= (held[loser], -len(ids[loser]))
    if held[winner] == held[loser]:
        assert ids[winner] < ids[loser]

    loads = [int(n) for n in re.findall(r"stage 0 state loaded from \S+ \((\d+) steps", logs[loser])]
    assert loads and min(loads) >= APART_AT + 1, loads
    hashes = [{ck.steps: ck.params_sha256 for ck in map(checkpoints.load, checkpoints.listing(tmp_path / r))}
              for r in relays]
    apart = hashes[0][APART_AT + 1] != hashes[1][APART_AT + 1]
    assert apart, "the fault did not make the copies part"
    # (after the download: the loser's checkpoint of the steps it downloaded was written before, by its own step)
    both = sorted(s for s in set(hashes[0]) & set(hashes[1]) if s > max(loads))
    assert len(both) >= 2, (loads, sorted(hashes[0]), sorted(hashes[1]))
    assert all(hashes[0][s] == hashes[1][s] for s in both), [(s, hashes[0][s][:8], hashes[1][s][:8]) for s in both]
