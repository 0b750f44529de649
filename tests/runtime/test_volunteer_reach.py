"""Reachability as status.json and the dashboard say it (runtime/node/status.py `_reachability`).

A node started with `--announce ADDR` was told the address peers reach it at: it advertises only that address
and reserves no relay slot (relay.py), so until a peer's dial-back says otherwise it is `public` on the basis
`announced`, not `unknown`.  One node, alone (no peer could check it), as a task of the test's process."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.node.node import Node, NodeOptions

from support.helpers import until
from support.inproc import InProcessSwarm

pytestmark = pytest.mark.trio


@pytest.mark.parametrize(("announce", "kind", "basis"), [
    (["203.0.113.7:4001"], "public", "announced"),  # a public address it was told to use
    ([], "local", "addresses"),  # loopback only: a swarm on one machine
])
async def test_an_announced_public_address_counts_as_reachable(tmp_path: Path, announce: list[str], kind: str,
                                                              basis: str) -> None:
    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=1, layers=1, hidden=16, seq_len=8, microbatch_size=1,
                                   microbatches_per_iteration=1), run)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            swarm = InProcessSwarm(tmp_path / "w", run, nursery, stages=1, relays_per_stage=1, iterations=0)
            sd = tmp_path / "w" / "d0"
            sd.mkdir(parents=True)
            swarm.admit(sd, "data")
            node = Node(NodeOptions(run_path=run, role="data", stage=None, state_dir=sd, name="d0",
                                    announce=announce))
            nursery.start_soon(node.run)
            try:
                await until(lambda: node.parts is not None and (sd / "addr").exists(), "d0 listens", 60)
                if announce:
                    assert (sd / "addr").read_text().startswith("/ip4/203.0.113.7/tcp/4001/p2p/")
                reach = node.parts.status.snapshot()["reachability"]
                assert (reach["kind"], reach["basis"]) == (kind, basis), reach
                assert node.parts.status.view()["node"]["reachability"]["kind"] == kind
            finally:
                node.stop()
