"""bf16 on a real swarm: a run in bf16-mixed with bf16 on the wire trains what the centralized reference trains.

1 data node and 2 stages x 1 relay on loopback, 3 iterations, `train.precision
= bf16-mixed` and `train.wire_dtype = bf16`: every iteration's loss equals the
one `gwtf-node local --centralized` computes with the same manifest
(`reference.train_centralized`), up to the order in which the mean of an
iteration's losses is summed, and every part's final parameters equal the
reference's bit for bit: the casts and the autocast happen inside the stage
executor, where the reference's chain meets them too, and at 32 tokens a
microbatch the relays hold most weight gradients as factors and add them in
chunks (`StageModel.commit_many`), as the reference does.  The tensors really
travelled in bfloat16: every node's bytes sent are 2 per element of the six
tensors of each microbatch.  With Top-K (ratio 4) the values travel in
bfloat16 beside int32 indices, and the losses equal the compressed chain's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from gwtf_node.model.crossings import Crossings
from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.local.swarm import LocalSwarm, run_local

pytestmark = pytest.mark.slow

ITERATIONS = 3


def _bf16_swarm(tmp_path: Path, relays_per_stage: int, **manifest):
    """A 2-stage run in bf16-mixed with bf16 on the wire, trained by a local swarm: (manifest, swarm, records)."""
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=4, **manifest)
    man = dataclasses.replace(man, train=dataclasses.replace(man.train, precision="bf16-mixed", wire_dtype="bf16"))
    man.validate(check_files=False)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=relays_per_stage,
                       iterations=ITERATIONS)
    swarm.startup_timeout_s = 120
    swarm.iteration_timeout_s = 120
    return man, swarm, run_local(swarm, lambda rec: None)


@pytest.mark.parametrize("compression", ["none", "topk"])
def test_bf16_swarm_equals_the_bf16_reference(tmp_path: Path, compression: str) -> None:
    man, swarm, records = _bf16_swarm(tmp_path, 1, compression=compression, compression_ratio=4.0)

    crossings = Crossings.uniform(2, 4.0) if compression == "topk" else None
    ref = train_centralized(man, ITERATIONS, crossings=crossings)
    want = ref.losses
    assert [r["microbatches"] for r in records] == [4] * ITERATIONS
    assert all(math.isfinite(r["loss"]) for r in records)
    assert [r["loss"] for r in records] == pytest.approx(want, rel=1e-6, abs=0), (records, want)
    for name in swarm.names():
        ck = torch.load(tmp_path / name / "checkpoint.pt", weights_only=False)
        part = "data" if ck["role"] == "data" else f"stage{ck['stage']}"
        assert torch.equal(ck["params"], ref.params[part]), (name, float((ck["params"] - ref.params[part]).abs().max()))
    statuses = [json.loads((tmp_path / n / "status.json").read_text()) for n in swarm.names()]
    numel = 2 * man.data.seq_len * 64
    dense = sum(s["compression"]["dense_bytes"] for s in statuses)
    sent = sum(s["compression"]["sent_bytes"] for s in statuses)
    assert dense == ITERATIONS * 4 * 6 * numel * 2, dense  # six bf16 tensors per microbatch, 2 bytes an element
    if compression == "topk":
        k = math.ceil(numel / 4.0)
        assert sent == ITERATIONS * 4 * 6 * k * (4 + 2), sent  # int32 index + bf16 value per kept element
    else:
        assert sent == dense


def test_a_bf16_stage_of_two_relays_all_reduces_in_bf16_and_its_copies_stay_identical(tmp_path: Path) -> None:
    """2 stages x 2 relays, bf16-mixed with bf16 on the wire: each stage's all-reduce travels in bfloat16 (half the
    bytes of float32: runtime/node/allreduce.py) and no node refuses a chunk of it; both copies of each stage end
    with the same bits; the first loss is the reference's (no step yet) and the later ones stay within 1 % of it
    (the reference does not round the relays' sums)."""
    man, swarm, records = _bf16_swarm(tmp_path, 2)

    assert [r["microbatches"] for r in records] == [4] * ITERATIONS
    want = train_centralized(man, ITERATIONS).losses
    assert records[0]["loss"] == pytest.approx(want[0], rel=1e-6, abs=0)
    assert [r["loss"] for r in records] == pytest.approx(want, rel=1e-2), (records, want)
    for k in range(2):
        a, b = (torch.load(tmp_path / f"r{k}_{i}" / "checkpoint.pt", weights_only=False) for i in range(2))
        assert a["steps"] == b["steps"] == ITERATIONS and torch.equal(a["params"], b["params"]), k
        for i in range(2):
            st = json.loads((tmp_path / f"r{k}_{i}" / "status.json").read_text())
            sent = st["last_all_reduce"]["sent_mb"]
            assert sent == pytest.approx(2 * (2 - 1) / 2 * a["params"].numel() * 2 / 1e6, abs=2e-3), sent
    for name in swarm.names():
        assert "refused frame" not in (tmp_path / name / "node.log").read_text(), name
