"""`gwtf-node join --stage auto` and discovery through the DHT, on real processes.

Relays join one at a time with `--stage auto` and the elected leader places
each at the most utilized (here: the empty) stage; the swarm trains exactly
as the centralized reference does; a newcomer that knows only one address finds the
run's manifest, the node records and the members of each stage in the DHT.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import RunManifest, default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.host import open_host
from gwtf_node.runtime.local import LocalSwarm

from swarmutil import wait_records

pytestmark = [pytest.mark.slow, pytest.mark.trio]


async def test_auto_stage_and_dht_discovery(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=100000,
                       auto_stage=True)
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 2, 180)
        stages = {json.loads((tmp_path / n / "status.json").read_text())["stage"] for n in ("r0_0", "r1_0")}
        assert stages == {0, 1}  # the leader placed the second auto relay in the stage nobody served
        # and it is real training: the losses are the centralized reference's
        ref = train_centralized(man, 2)
        recs = swarm.records()[:2]
        assert [r["loss"] for r in recs] == pytest.approx(ref.losses, rel=1e-4)

        boot = (tmp_path / "d0" / "addr").read_text().split()[0]
        ids = {n: json.loads((tmp_path / n / "status.json").read_text())["peer_id"] for n in ("d0", "r0_0", "r1_0")}
        async with open_host(tmp_path / "newcomer", bootstrap=[boot]) as host:
            with trio.fail_after(60):
                while True:
                    raw = await host.dht_get(f"run/{man.run_id}")
                    if raw is not None:
                        break
                    await trio.sleep(0.5)
            assert RunManifest.from_json(raw.decode()).run_id == man.run_id
            for name, pid in ids.items():
                with trio.fail_after(30):
                    while (rec := await host.dht_get(f"node/{pid}")) is None:
                        await trio.sleep(0.5)
                rec = json.loads(rec)
                assert rec["name"] == name and rec["run_id"] == man.run_id
            with trio.fail_after(30):
                while True:
                    found = {pid for pid, _ in await host.find_providers(f"run/{man.run_id}/stage/1")}
                    if ids["r1_0"] in found:
                        break
                    await trio.sleep(0.5)
        swarm._check_alive()
    finally:
        await trio.to_thread.run_sync(swarm.stop)
