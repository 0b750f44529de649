"""Centralized reference: the same stages, chained in one process, on the same microbatches.

Theory of operation
-------------------
DESIGN.md "The invariant": with no churn, the parameters after each iteration
equal those of centralized training on the same microbatches with the same
optimizer, up to floating-point summation order.  This module *is* that
centralized training, written against the very `StageModel` API the daemon
uses, so that a swarm test can compare losses and final parameters with it:

* iteration t, data node i uses seqs t*M .. t*M+M-1 of
  `MicrobatchSource(data_index=i, n_data=data_nodes)`, M =
  microbatches_per_iteration;
* each microbatch goes data.embed -> relay 0 .. S-1 forward -> data.head_loss,
  then back through relay S-1 .. 0 backward -> data.embed_backward;
* the parts hold each microbatch's gradients as the nodes do and add them in
  the order of the microbatches: the relays at the end of the iteration
  (`StageModel.commit_many`: the factors of consecutive microbatches
  multiplied out together), the data part its head's as each microbatch
  completes (`count_held`: in chunks of several);
* every part then applies `apply_mean_grad(sum of its gradients over all
  microbatches of the iteration, count = data_nodes * M)`.  The data nodes
  all hold a copy of the same embedding and head, so one data part stands for
  all of them here: its accumulator is the sum over every data node's
  microbatches, which is what the data nodes' all-reduce computes.

`crossings` (`crossings.py`) trains what a run with `train.compression`
computes instead: the same chain with the Top-K of the tensor channel at the
crossings between the parts.

Precision (`precision.py`): the chain calls the very `StageModel` methods a
node calls, and those cast what they hand out to the run's wire dtype and run
their forward computations under the run's autocast, so the centralized
chain meets the casts of a bf16 wire at the crossings, where the swarm's
links are, and the same autocast (tests/swarm/test_precision_swarm.py: equal
losses, and final parameters equal bit for bit).

The loss of an iteration is the mean of its microbatch losses (each the mean
token cross-entropy of one microbatch, all microbatches the same size).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .crossings import Crossings
from .data import MicrobatchSource, encode_corpus, load_tokenizer
from .manifest import RunManifest
from .stages import StageModel, build_stages, part_name


@dataclass
class CentralizedResult:
    losses: list[float] = field(default_factory=list)  # mean microbatch loss per iteration
    samples: list[int] = field(default_factory=list)  # sequences trained on per iteration
    params: dict[str, torch.Tensor] = field(default_factory=dict)  # final param_vector() per part_name
    state_hashes: dict[str, str] = field(default_factory=dict)  # final state_hash() per part_name


def build_chain(manifest: RunManifest, device: Any = "cpu") -> tuple[StageModel, list[StageModel]]:
    """The data part and every relay stage, each built as the node holding it builds it (`build_stage`: the same
    parameters, drawn from the same per-parameter seeds or read from the same weights), from one meta skeleton."""
    data, *relays = build_stages(manifest, [("data", None)] + [("relay", k) for k in range(manifest.num_stages)],
                                 device)
    return data, relays


def run_microbatch(
    data: StageModel, relays: list[StageModel], key: Any, input_ids: torch.Tensor, targets: torch.Tensor,
    crossings: Crossings | None = None, hold: bool = False,
) -> float:
    """Forward and backward of one microbatch through the chain; returns its loss.  With `crossings`, the
    tensors between the parts go through a compressed run's Top-K (`crossings.py`).  `hold`: the parts hold
    its gradients as the nodes do, the relays until `commit_many`, the data part its head's until the microbatch
    completes (`count_held`)."""
    forward_at = crossings.forward_at if crossings is not None else (lambda i, t: (t, None))
    backward_at = crossings.backward_at if crossings is not None else (lambda i, g, kept: g)
    kept = []
    h = data.embed(key, input_ids)
    for i, r in enumerate(relays):
        h, idx = forward_at(i, h)
        kept.append(idx)
        h = r.forward(key, h)
    h, idx = forward_at(len(relays), h)
    kept.append(idx)
    loss, g = data.head_loss(key, h, targets, hold=hold)
    for i in range(len(relays), 0, -1):
        g = relays[i - 1].backward(key, backward_at(i, g, kept[i]), hold=hold)
    if hold:
        data.count_held(key)
    data.embed_backward(key, backward_at(0, g, kept[0]))
    return loss


def make_sources(manifest: RunManifest, data_nodes: int) -> list[MicrobatchSource]:
    """One source per data node, sharing one encoding of the corpus."""
    tok = load_tokenizer(manifest.data.tokenizer, manifest)
    tokens = encode_corpus(manifest.data, tok, manifest)
    return [
        MicrobatchSource(manifest.data, tok, i, data_nodes, manifest.train.seed, tokens=tokens, manifest=manifest)
        for i in range(data_nodes)
    ]


def train_centralized(
    manifest: RunManifest,
    iterations: int,
    data_nodes: int = 1,
    device: Any = "cpu",
    on_iteration: Callable[[int, float], None] | None = None,
    crossings: Crossings | None = None,
    reverse: bool = False,
) -> CentralizedResult:
    """Train `iterations` iterations centrally (module doc).  `reverse` runs each iteration's microbatches in
    the reverse order: the same sums in another floating-point order, the gap any schedule of the same
    computation may show (scripts/bench_swarm_size.py measures a swarm's losses against it)."""
    data, relays = build_chain(manifest, device)
    sources = make_sources(manifest, data_nodes)
    M = manifest.data.microbatches_per_iteration
    result = CentralizedResult()
    for t in range(iterations):
        jobs = [(i, src, seq) for i, src in enumerate(sources) for seq in range(t * M, (t + 1) * M)]
        losses = []
        for i, src, seq in reversed(jobs) if reverse else jobs:
            x, y = src.get(seq)
            losses.append(run_microbatch(data, relays, (i, seq), x, y, crossings, hold=True))
        for r in relays:
            r.commit_many([(i, seq) for i, _src, seq in jobs])
        count = len(losses)
        for part in (data, *relays):
            part.apply_mean_grad(part.grad_vector(), count)
        mean_loss = sum(losses) / count
        result.losses.append(mean_loss)
        result.samples.append(count * manifest.data.microbatch_size)
        if on_iteration is not None:
            on_iteration(t, mean_loss)
    for part in (data, *relays):
        result.params[part_name(part.role, part.stage)] = part.param_vector()
        result.state_hashes[part.name] = part.state_hash()
    return result
