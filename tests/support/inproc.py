"""A swarm of daemons in the test's own process: `Node.run` tasks in one trio nursery, over real libp2p on loopback.

What `LocalSwarm` (runtime/local/swarm.py) starts as `gwtf-node join` processes,
started here as tasks: the same `Node` with the options the CLI would give
it (the launcher's owner key signs the run and admits every node, through
`LocalSwarm`'s own code), without a process, an import of torch and libp2p
and a model build per node.  A test that checks what a node decides on the
wire (refusals, bounds, bans, hand-overs) needs nothing more; the tests that
need separate processes (crashes, signals, the CLI) use `LocalSwarm`.

Every wait is bounded (`helpers.until`), and leaving the `async with` stops
every node (also on failure).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import trio

from gwtf_node.runtime.local.swarm import LocalSwarm
from gwtf_node.runtime.node.node import Node, NodeOptions

from support.helpers import until

START_S = 60.0  # bound on one node's start (its stage built, listening)


class InProcessSwarm:
    """1 or more data nodes and `stages` x `relays_per_stage` relays as `Node` tasks of one nursery."""

    def __init__(self, workdir: Path, run: Path, nursery: trio.Nursery, *, data_nodes: int = 1, stages: int,
                 relays_per_stage: int, iterations: int, options: dict | None = None,
                 node_options: dict[str, dict] | None = None) -> None:
        self.owner = LocalSwarm(workdir, run, data_nodes, stages, relays_per_stage, iterations)  # signs, admits
        self.workdir, self.run, self.nursery = workdir, run, nursery
        self.run_id = self.owner.run_id
        self.data_nodes, self.stages, self.relays_per_stage = data_nodes, stages, relays_per_stage
        self.iterations = iterations
        self.options = dict(options or {})  # more NodeOptions of every node
        self.node_options = dict(node_options or {})  # name -> NodeOptions of that node, over `options`
        self.nodes: dict[str, Node] = {}
        from gwtf_node.model.manifest import load_manifest

        demand = data_nodes * load_manifest(run, check_files=False).data.microbatches_per_iteration
        self.relay_capacity = -(-demand // relays_per_stage)

    def admit(self, state_dir: Path, role: str) -> Path:
        return self.owner.admit(state_dir, role)

    def names(self) -> list[str]:
        return [f"d{i}" for i in range(self.data_nodes)] + [
            f"r{k}_{i}" for k in range(self.stages) for i in range(self.relays_per_stage)]

    def addr(self, name: str) -> str:
        return (self.workdir / name / "addr").read_text().split()[0]

    def peer_id(self, name: str) -> str:
        return self.nodes[name].parts.wire.me

    async def start_node(self, name: str, boot: str | None, *, auto: bool = False) -> Node:
        """Start node `name` (d<i>: a data node; r<k>_<i>: a relay of stage k, or `auto`: placed by the leader)
        with `boot` as its bootstrap address; returns once it listens."""
        sd = self.workdir / name
        sd.mkdir(parents=True, exist_ok=True)
        data = name.startswith("d")
        self.admit(sd, "data" if data else "relay")
        opts = NodeOptions(run_path=self.run, role="data" if data else "relay",
                           stage=None if data or auto else int(name[1:].split("_")[0]), state_dir=sd, name=name,
                           bootstrap=[boot] if boot else [], data_index=int(name[1:]) if data else 0,
                           data_nodes=self.data_nodes, iterations=self.iterations if data else 0,
                           capacity=0 if data else self.relay_capacity,
                           **{**self.options, **self.node_options.get(name, {})})
        node = Node(opts)
        self.nodes[name] = node
        self.nursery.start_soon(node.run)
        await until(lambda: node.parts is not None and (sd / "addr").exists(), f"{name} listens", START_S)
        return node

    async def start(self) -> None:
        await self.start_node("d0", None)
        boot = self.addr("d0")
        for name in self.names()[1:]:
            await self.start_node(name, boot)

    async def wait_stage(self, name: str, timeout: float = START_S) -> int:
        """The stage a relay serves, once it has one (placed by the leader, for an `auto` relay)."""
        node = self.nodes[name]
        await until(lambda: node.peers.stage is not None, f"{name} has a stage", timeout, poll_s=0.1)
        return node.peers.stage

    def records(self) -> list[dict]:
        """The leader's per-iteration records so far (metrics.jsonl), in iteration order."""
        return self.owner.records()

    async def wait_records(self, n: int, timeout: float) -> list[dict]:
        await until(lambda: len(self.records()) >= n, f"{n} iterations recorded", timeout, poll_s=0.1)
        return self.records()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()


@asynccontextmanager
async def in_process_swarm(workdir: Path, run: Path, *, deadline_s: float = 300.0,
                           **kw) -> AsyncIterator[InProcessSwarm]:
    """An `InProcessSwarm` whose nodes all stop when the block is left; the block and the nodes' ends are bounded
    by `deadline_s` (trio.TooSlowError)."""
    with trio.fail_after(deadline_s):
        async with trio.open_nursery() as nursery:
            swarm = InProcessSwarm(workdir, run, nursery, **kw)
            try:
                yield swarm
            finally:
                swarm.stop()
