"""A node started without --name is called by its role and the tail of its peer id (events.default_name): in its
log, its Hello (so its peers' logs, status and dashboard) and its own status.json.

The swarm (1 data node, 1 relay, neither named) runs as tasks of the test's process (tests/support/inproc.py); a
forgotten peer keeps its name on the dashboard (runtime/node/status.py `name_of`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.ops.events import default_name, short_id
from gwtf_node.runtime.node.node import Node, NodeOptions
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place
from gwtf_node.runtime.node.status import name_of

from support.helpers import until
from support.inproc import InProcessSwarm

DEADLINE_S = 240


def test_default_name_is_role_and_peer_id_tail() -> None:
    pid = "12D3KooWNT6wMbQ97ZaqS6vJHxwh9bSUYBoBMg5jtSXJLjM3uMoe"
    assert default_name("relay", pid) == "relay-M3uMoe" == f"relay-{short_id(pid)}"
    assert default_name("data", pid) == "data-M3uMoe"


def test_a_forgotten_peer_keeps_its_name_on_the_dashboard() -> None:
    peers = Peers("me", "d0", 1, Place("data", -1, 1))
    peers.upsert(PeerInfo("12D3KooWleaderXYZabc", "data", -1, name="d1"), 0.0)
    assert name_of(peers, "12D3KooWleaderXYZabc") == "d1"
    peers.forget("12D3KooWleaderXYZabc")  # it left (or crashed): the leader shown is still d1, not `XYZabc`
    assert name_of(peers, "12D3KooWleaderXYZabc") == "d1"
    assert name_of(peers, "12D3KooWnever000seen") == "00seen"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.trio
async def test_nodes_without_name_are_called_by_role_and_peer_id(tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=1, layers=1, hidden=16, seq_len=8, microbatch_size=1,
                                   microbatches_per_iteration=1), run)
    node_log, lines = logging.getLogger("gwtf.node"), _Lines()  # (its own handler: whatever other tests left)
    level = node_log.level
    node_log.setLevel(logging.INFO)
    node_log.addHandler(lines)
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            swarm = InProcessSwarm(tmp_path / "w", run, nursery, stages=1, relays_per_stage=1, iterations=0)
            nodes: dict[str, Node] = {}
            try:
                for name, role, stage in (("d0", "data", None), ("r0_0", "relay", 0)):
                    sd = tmp_path / "w" / name
                    sd.mkdir(parents=True, exist_ok=True)
                    swarm.admit(sd, role)
                    boot = [] if role == "data" else [(tmp_path / "w" / "d0" / "addr").read_text().split()[0]]
                    node = nodes[name] = Node(NodeOptions(run_path=run, role=role, stage=stage, state_dir=sd,
                                                          bootstrap=boot, capacity=0 if role == "data" else 1))
                    nursery.start_soon(node.run)
                    await until(lambda: node.parts is not None and (sd / "addr").exists(), f"{name} listens", 60)
                d0, r0 = nodes["d0"], nodes["r0_0"]
                d_id, r_id = d0.parts.wire.me, r0.parts.wire.me
                await until(lambda: r0.peers.get(d_id) is not None and d0.peers.get(r_id) is not None,
                            "the two nodes met", 60)
                assert r0.peers.get(d_id).name == f"data-{d_id[-6:]}"  # (its Hello carried it)
                assert d0.peers.get(r_id).name == f"relay-{r_id[-6:]}"
                assert d0.parts.status.snapshot()["name"] == f"data-{d_id[-6:]}"
                await until(lambda: r0.parts.status.view()["election"]["leader_name"] is not None, "a leader", 60)
                assert r0.parts.status.view()["election"]["leader_name"] == f"data-{d_id[-6:]}"
            finally:
                for node in nodes.values():
                    node.stop()
                node_log.removeHandler(lines)
                node_log.setLevel(level)
    said = "\n".join(lines.lines)
    assert f"node data-{d_id[-6:]} (data) peer id {d_id}" in said and "without --name" not in said
