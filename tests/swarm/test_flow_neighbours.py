"""Bounded flow neighbourhoods, end to end: relays that link to fewer next-stage relays than there are still train
exactly as one process does.

1 data node, 2 stages x 2 relays, every relay started with `--flow-neighbours 1`: a first-stage relay links its
flows to its one cheapest second-stage relay, a second-stage relay to its one cheapest first-stage relay, and each
end of a link either chose takes it (the chooser's `LinkCost` or labels tell the other; protocol/neighbourhood.py).
Both ends agree on every link, every relay has one on each side, and the loss of every iteration equals the
centralized reference.
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

    first, second = ("r0_0", "r0_1"), ("r1_0", "r1_1")
    logs = {n: log_text(tmp_path, n) for n in first + second}
    for name in first:
        assert "flows: linking to the 1 cheapest of 2 next-stage relays" in logs[name], logs[name][-3000:]
        started = re.search(r"flow machine started: next (.*?) prev", logs[name]).group(1)
        assert len(started.split(", ")) == 1, (name, started)  # its own choice; the others link to it later
    links = {(a, b) for a in first for b in _linked(logs[a], "next")}
    assert links == {(a, b) for b in second for a in _linked(logs[b], "prev")}, digest  # both ends agree
    assert {a for a, _ in links} == set(first) and {b for _, b in links} == set(second), links  # none left out
