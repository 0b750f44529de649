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
from gwtf_node.runtime.net.host import open_host
from gwtf_node.runtime.local.swarm import LocalSwarm
from gwtf_node.runtime.trust.records import RunRecords

from support.swarmutil import assert_losses, wait_records

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
        assert_losses(recs, ref.losses)

        boot = (tmp_path / "d0" / "addr").read_text().split()[0]
        ids = {n: json.loads((tmp_path / n / "status.json").read_text())["peer_id"] for n in ("d0", "r0_0", "r1_0")}
        run_id, owner = swarm.run_id, RunManifest.from_json(run.read_text()).owner_public_key
        async with open_host(tmp_path / "newcomer", bootstrap=[boot]) as host:
            records = RunRecords(host, run_id, owner, on_refused=lambda why: pytest.fail(why))
            with trio.fail_after(60):
                while True:
                    got = await records.get(f"run/{run_id}")
                    if got is not None:
                        break
                    await trio.sleep(0.5)
            assert RunManifest.from_json(got.value).run_id == run_id and got.writer == ids["d0"]
            for name, pid in ids.items():
                with trio.fail_after(30):
                    while (got := await records.get(f"node/{pid}")) is None:
                        await trio.sleep(0.5)
                assert got.writer == pid  # signed by the node itself (records.py)
                assert got.value["name"] == name and got.value["run_id"] == run_id
            with trio.fail_after(30):
                while True:
                    found = {pid for pid, _ in await host.find_providers(f"run/{run_id}/stage/1")}
                    if ids["r1_0"] in found:
                        break
                    await trio.sleep(0.5)
        swarm._check_alive()
    finally:
        await trio.to_thread.run_sync(swarm.stop)
