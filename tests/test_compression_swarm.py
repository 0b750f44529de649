"""Top-K on a real swarm: a run with `train.compression = topk` trains what the compressed chain computes.

1 data node and 2 stages x 1 relay (every link then carries one Top-K of
ratio 4 each way), 2 iterations.  The losses the leader records equal those
of the centralized chain with the same Top-K applied at the six crossings
(embedding -> stage 0 -> stage 1 -> head forward, and the gradients back),
stay finite, and differ from the uncompressed run's: the tensors really
travelled sparse and were rebuilt dense on the other side.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gwtf_node.model.adatopk import kept_count
from gwtf_node.model.compression import topk_decode, topk_encode
from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import build_chain, make_sources, train_centralized
from gwtf_node.runtime.local import LocalSwarm, run_local

pytestmark = pytest.mark.slow

ITERATIONS = 2
RATIO = 4.0


def _topk(t: torch.Tensor) -> torch.Tensor:
    k = kept_count(t.numel(), RATIO, t.element_size())
    idx, vals = topk_encode(t, k)
    return topk_decode(idx, vals, tuple(t.shape))


def compressed_reference(man, iterations: int) -> list[float]:
    """Centralized training with the Top-K of every tensor that crosses a link."""
    data, relays = build_chain(man)
    src = make_sources(man, 1)[0]
    per = man.data.microbatches_per_iteration
    losses = []
    for t in range(iterations):
        got = []
        for seq in range(t * per, (t + 1) * per):
            x, y = src.get(seq)
            key = (0, seq)
            h = _topk(data.embed(key, x))
            for r in relays:
                h = _topk(r.forward(key, h))
            loss, g = data.head_loss(key, h, y)
            g = _topk(g)
            for r in reversed(relays):
                g = _topk(r.backward(key, g))
            data.embed_backward(key, g)
            got.append(loss)
        for part in (data, *relays):
            part.apply_mean_grad(part.grad_vector(), len(got))
        losses.append(sum(got) / len(got))
    return losses


def test_topk_swarm_trains_the_compressed_chain(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=4,
                           compression="topk", compression_ratio=RATIO)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=ITERATIONS)
    swarm.startup_timeout_s = 120
    swarm.iteration_timeout_s = 120
    records = run_local(swarm, lambda rec: None)

    want = compressed_reference(man, ITERATIONS)
    dense = train_centralized(default_manifest(stages=2, seq_len=32, microbatch_size=2,
                                               microbatches_per_iteration=4), ITERATIONS).losses
    assert [r["microbatches"] for r in records] == [4] * ITERATIONS
    for rec, loss in zip(records, want):
        assert math.isfinite(rec["loss"])
        assert rec["loss"] == pytest.approx(loss, rel=1e-3), (rec, loss)
    # not what the dense run computes (after one step on sparse gradients; the first loss barely moves)
    assert abs(records[-1]["loss"] - dense[-1]) > 1e-2 * dense[-1], (records[-1], dense[-1])
    assert records[-1]["loss"] < records[0]["loss"]
    logs = "".join((tmp_path / n / "node.log").read_text(errors="replace") for n in swarm.names())
    assert "compression topk to" in logs and "ratio 4.00" in logs
