"""The invariant, end to end: a swarm of separate processes on loopback computes what one process computes.

1 data node, 2 stages x 2 relays, no churn, 5 iterations of the LLaMA-like
model; and 4 iterations of the GPT-like model with 2 data nodes, whose
embedding/head gradients are all-reduced among them: the loss of every
iteration equals the centralized reference within 1e-4 relative, and so do
the final parameters of every stage (relative to the parameter norm; AdamW
turns summation-order noise in near-zero gradients into ~1e-5 absolute
differences, see model/reference.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.local.swarm import LocalSwarm, run_local

pytestmark = pytest.mark.slow

ITERATIONS = 5


def _final_params(workdir: Path, name: str) -> tuple[str, int, torch.Tensor]:
    ck = torch.load(workdir / name / "checkpoint.pt", weights_only=False)
    return ck["role"], ck["stage"], ck["params"]


@pytest.mark.parametrize("family, data_nodes, iterations", [("llama", 1, ITERATIONS), ("gpt", 2, 4)])
def test_swarm_equals_centralized(tmp_path: Path, family: str, data_nodes: int, iterations: int) -> None:
    man = default_manifest(family=family, stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=data_nodes, stages=2, relays_per_stage=2, iterations=iterations)
    swarm.startup_timeout_s = 120
    swarm.iteration_timeout_s = 120
    records = run_local(swarm, lambda rec: None)
    ref = train_centralized(man, iterations, data_nodes=data_nodes)

    assert [r["iteration"] for r in records] == list(range(iterations))
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 4 * data_nodes
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)
    assert records[-1]["loss"] < records[0]["loss"]

    seen = set()
    for name in swarm.names():
        role, stage, params = _final_params(tmp_path, name)
        part = "data" if role == "data" else f"stage{stage}"
        seen.add(part)
        want = ref.params[part]
        assert params.shape == want.shape
        err = (params - want).norm() / want.norm()
        assert err < 1e-4, (name, float(err))
    assert seen == {"data", "stage0", "stage1"}
    # every relay did take part: both relays of a stage end with the same parameters as the reference
    statuses = {name: json.loads((tmp_path / name / "status.json").read_text()) for name in swarm.names()}
    data_ids = {st["peer_id"] for st in statuses.values() if st["role"] == "data"}
    # both ends of every flow link use one cost, the upstream end's measurement (LinkCost)
    by_id = {st["peer_id"]: st for st in statuses.values()}
    links = 0
    for st in statuses.values():
        for down, cost in st["link_costs"]["next"].items():
            assert by_id[down]["link_costs"]["prev"][st["peer_id"]] == cost, (st["name"], by_id[down]["name"])
            links += 1
    assert links == data_nodes * 2 + 4 + 2 * data_nodes, links
    for name in [n for n in swarm.names() if statuses[n]["role"] == "relay"]:
        # a quiet log: in steady state (from its first step to the one before the last: the swarm stops during the
        # last) a relay logs at most 1.5 INFO lines per iteration: the line of each step, and the odd news
        lines = (tmp_path / name / "node.log").read_text().splitlines()
        steps = [i for i, ln in enumerate(lines) if " INFO gwtf.steps: iteration " in ln and "summed in round" in ln]
        assert len(steps) == iterations, (name, steps)
        info = [ln for ln in lines[steps[0] + 1:steps[-2] + 1] if " INFO " in ln]
        assert len(info) <= 1.5 * (iterations - 2), (name, info)
    for name, status in statuses.items():
        assert status["steps_applied"] == iterations, (name, status["steps_applied"])
        # nobody was taken for dead while training (data nodes that finished and exited may be, at the end)
        assert set(status["presumed_dead"]) <= data_ids, (name, status["presumed_dead"])
        if status["role"] == "data" and data_nodes > 1:
            # lending: the last microbatch of an iteration to complete frees a unit that is lent (Lend)
            assert status["recovery"]["lent"] >= iterations, (name, status["recovery"])
