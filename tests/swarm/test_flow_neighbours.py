"""Bounded flow neighbourhoods, end to end: relays that link to fewer next-stage relays than there are still train
exactly as one process does.

1 data node, 2 stages x 2 relays, every relay started with `--flow-neighbours 1`: a first-stage relay links its
flows to its one cheapest second-stage relay (protocol/neighbourhood.py), and a second-stage relay (its stage is
larger than the bound) links back only to the first-stage relays whose `LinkCost` said they chose it.  The loss of
every iteration equals the centralized reference.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.local.swarm import LocalSwarm, run_local
from tests.support.swarmutil import log_digest, log_text

pytestmark = pytest.mark.slow

ITERATIONS = 3


def _linked(log: str, side: str) -> set[str]:
    """The names of the peers a node's flow machine linked on `side` ("next" / "prev"): at its start and since."""
    names: set[str] = set()
    for listed in re.findall(r"flow machine started: next (.*?) prev (.*)$", log, re.M):
        part = listed[0] if side == "next" else listed[1]
        names.update(x.split("=")[0] for x in part.split(", ") if "=" in x)
    names.update(re.findall(rf"flows: adding (\S+) as {side} neighbour", log))
    return names


def test_relays_linked_to_one_next_stage_relay_train_exactly(tmp_path: Path) -> None:
    man = default_manifest(family="llama", stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=2, iterations=ITERATIONS,
                       relay_capacity=4)
    swarm.extra_args = {n: ["--flow-neighbours", "1"] for n in swarm.names() if n.startswith("r")}
    swarm.startup_timeout_s = 120
    swarm.iteration_timeout_s = 120
    records = run_local(swarm, lambda rec: None)
    ref = train_centralized(man, ITERATIONS)
    digest = log_digest(tmp_path, swarm.names())

    assert [r["iteration"] for r in records] == list(range(ITERATIONS)), digest
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 4
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss, digest)

    second = {"r1_0", "r1_1"}
    chosen: dict[str, str] = {}
    for name in ("r0_0", "r0_1"):
        log = log_text(tmp_path, name)
        assert "flows: linking to the 1 cheapest of 2 next-stage relays" in log, log[-3000:]
        nxt = _linked(log, "next")
        assert len(nxt) == 1 and nxt <= second, (name, nxt)
        chosen[name] = nxt.pop()
    for name in sorted(second):
        prev = _linked(log_text(tmp_path, name), "prev")
        assert prev == {a for a, b in chosen.items() if b == name}, (name, prev, chosen)
