"""Two data nodes keep training when either dies: a relay is the election's witness, on real processes.

2 data nodes and 1 stage x 2 relays train.  The acting leader takes the relay
with the lowest peer id as the third voter (protocol/leader.py "Two data
nodes: witnesses"), seen in status.json.  Then one data node (the leader, or
the other one) is armed to SIGKILL itself as its next aggregation starts; the
survivor and the witness are a quorum of the three voters, so a leader acts
and training goes on.  Every loss equals the centralized reference of what
was trained, read from the nodes' logs as tests/swarm/test_leader_phase.py does:
the microbatches each data node completed, the dead node's only before the
iteration it died in (in that iteration the data part steps on the
survivor's; the loss counts the dead node's microbatches too when it was not
the leader, which had its IterationDone), and at the relays the contributions
they held.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local.swarm import LocalSwarm

from support.restartutil import reference_losses
from support.swarmutil import log_text, status, wait_exit, wait_for, wait_records, wait_summed

pytestmark = [pytest.mark.slow, pytest.mark.trio]
DATA_NODES = 2
M = 2  # microbatches per data node and iteration
AFTER = 1  # iterations trained after the one the data node died in
RELAYS = ("r0_0", "r0_1")

Key = tuple[int, int]  # (data node index, seq)


def trained(workdir: Path, died: int, dead: str) -> list[tuple[list[Key], list[Key]]]:
    names = [f"d{i}" for i in range(DATA_NODES)]
    settled: dict[int, dict[str, list[int]]] = {}
    for n in names:
        for it, seqs in re.findall(r"iteration (\d+) settled: completed (\[[^]]*\])", log_text(workdir, n)):
            settled.setdefault(int(it), {})[n] = json.loads(seqs)
    ids = {status(workdir, n)["peer_id"]: n for n in names if n != dead}
    ids[json.loads((workdir / dead / "status.json").read_text())["peer_id"]] = dead
    held: dict[int, set[Key]] = {}
    for relay in RELAYS:
        for it, keys in re.findall(r"iteration (\d+): summed in round \S+ contributions (\[.*\]);", log_text(workdir, relay)):
            named = [(next((v for k, v in ids.items() if k.startswith(who)), who), seq) for who, seq in json.loads(keys)]
            held.setdefault(int(it), set()).update((int(n[1:]), seq) for n, seq in named)
    plan = []
    for t in sorted(settled):
        live = [n for n in names if t < died or n != dead]
        data_keys = sorted((int(n[1:]), seq) for n in live for seq in settled[t].get(n, []))
        plan.append((data_keys, sorted(held.get(t, ()))))
    return plan


@pytest.mark.parametrize("victim", ["leader", "other"])
async def test_two_data_nodes_train_on_after_losing_either(tmp_path: Path, victim: str) -> None:
    man = default_manifest(stages=1, seq_len=16, microbatch_size=2, microbatches_per_iteration=M)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=DATA_NODES, stages=1, relays_per_stage=2, iterations=100000,
                       iteration_timeout_s=120)
    names = [f"d{i}" for i in range(DATA_NODES)]
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 2, 240)
        ids = {status(tmp_path, n)["peer_id"]: n for n in names}
        relay_ids = {status(tmp_path, r)["peer_id"]: r for r in RELAYS}
        leader = ids[await wait_for(lambda: status(tmp_path, "d0").get("leader"), 30, "a leader")]
        witness = min(relay_ids)
        await wait_for(lambda: status(tmp_path, leader).get("voters", {}).get("witnesses") == [witness], 30,
                       "the lowest relay as witness", swarm)
        assert status(tmp_path, relay_ids[witness])["voters"]["witness"] is True
        dead = leader if victim == "leader" else next(n for n in names if n != leader)
        survivor = next(n for n in names if n != dead)
        swarm.expected_dead.add(dead)
        (tmp_path / dead / "fault").write_text("aggregate:1")
        assert await wait_exit(swarm, dead, 120) == -9, "the fault did not fire"
        died = int(re.findall(r"iteration (\d+) settled", log_text(tmp_path, dead))[-1])
        await wait_for(lambda: ids.get(status(tmp_path, survivor).get("leader")) == survivor, 60,
                       "the survivor leading", swarm)
        waited = died + 1 + AFTER
        await wait_records(swarm, waited, 240)
        await wait_summed(swarm, RELAYS, waited, 120)  # (the relays sum an iteration after the data nodes may)
    finally:
        await trio.to_thread.run_sync(swarm.stop)
    # the records waited for: a later one may be written while the swarm stops, before the relays summed it
    records, plan = swarm.records()[:waited], trained(tmp_path, died, dead)
    assert [r["iteration"] for r in records] == list(range(len(records)))
    assert len(plan) >= len(records) >= died + 1 + AFTER, (len(plan), len(records))
    want = reference_losses(man, DATA_NODES, [(d, {0: r}) for d, r in plan[:len(records)]])
    if victim == "other":  # its losses of `died` reached the leader (IterationDone) before it died in the step
        full = [(sorted(set(d) | set(r)) if t == died else d, {0: r}) for t, (d, r) in enumerate(plan[:died + 1])]
        want[died] = reference_losses(man, DATA_NODES, full)[died]
    for r, (data_keys, held), loss in zip(records, plan, want):
        # the iteration the data node died in: its microbatches count (the relays hold theirs), its data part not
        assert r["microbatches"] == len(set(data_keys) | set(held)) and r["lost"] == 0, (r, data_keys, held)
        assert r["loss"] == pytest.approx(loss, rel=1e-4), (r, loss)
