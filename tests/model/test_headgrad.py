"""model/linearfactors.py on the data part: its head gradients, its weight's kept as two factors while a microbatch
is in flight, are bit for bit what autograd computes for the whole head, and take a fraction of the memory; its
embedding's gradient is the microbatch's rows (sparse), autograd's values."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gwtf_node.model.linearfactors import Factors, add_all, materialized
from gwtf_node.model.manifest import default_manifest
from gwtf_node.model.stages import build_stage


def _manifest(family: str, precision: str, hidden: int = 64):
    m = default_manifest(family=family, stages=2, layers=2, hidden=hidden, seq_len=16, microbatch_size=2,
                         microbatches_per_iteration=2)
    wire = "bf16" if precision == "bf16-mixed" else "fp32"
    return dataclasses.replace(m, train=dataclasses.replace(m.train, precision=precision, wire_dtype=wire))


def _autograd_head(part, hidden, targets):
    """The head as one autograd pass (what head_loss computed before its weight's gradient was factored)."""
    h = hidden.detach().float().requires_grad_(True)
    with torch.enable_grad():
        with part._compute():
            logits = part.module.head(h)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    g_h, *grads = torch.autograd.grad(loss, [h, *part.params], allow_unused=True)
    return float(loss.detach()), g_h.to(part.wire_dtype), grads


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
@pytest.mark.parametrize("family", ["llama", "gpt"])
@pytest.mark.parametrize("hidden", [64, 16])  # factors smaller than the weight's gradient / larger (multiplied at once)
def test_the_head_gradients_are_autograds_bit_for_bit_held_or_not(family, precision, hidden):
    m = _manifest(family, precision, hidden)
    part = build_stage(m, "data")
    gen = torch.Generator().manual_seed(3)
    hidden_t = torch.randn(2, 16, hidden, generator=gen)
    targets = torch.randint(0, m.dims.vocab, (2, 16), generator=gen)
    want_loss, want_g, want = _autograd_head(part, hidden_t, targets)

    loss, g = part.head_loss("held", hidden_t, targets, hold=True)
    assert loss == want_loss and torch.equal(g, want_g)
    held = part._held["held"]
    w = next(i for i, p in enumerate(part.params) if p is part.module.lm_head.weight)
    assert isinstance(held[w], Factors) == (hidden == 64)
    for got, ref in zip(held, want):
        assert (got is None) == (ref is None) and (ref is None or torch.equal(materialized(got), ref.float()))

    part.head_loss("at once", hidden_t, targets)  # not held: added to the accumulators at once
    acc = part.grad_vector()
    assert torch.equal(acc, torch.cat([(g if g is not None else torch.zeros_like(p)).float().reshape(-1)
                                       for g, p in zip(want, part.params)]))
    assert part.count_held("held")
    assert torch.equal(part.grad_vector(), acc + acc)


def test_a_microbatch_in_flight_holds_the_factors_not_the_vocabulary_by_hidden_matrix():
    m = _manifest("llama", "bf16-mixed", hidden=64)
    part = build_stage(m, "data")
    part.head_loss("k", torch.randn(2, 16, 64), torch.randint(0, m.dims.vocab, (2, 16)), hold=True)
    held = part._held["k"]
    factors = next(g for g in held if isinstance(g, Factors))
    v, h = part.module.lm_head.weight.shape
    assert factors.nbytes == 2 * 32 * (v + h)  # bfloat16 logits' gradient and head input, 32 tokens
    assert factors.nbytes < 4 * v * h / 3


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_counted_head_gradients_are_added_in_chunks_of_half_the_weights_bytes(precision):
    m = _manifest("llama", precision, hidden=128)
    part = build_stage(m, "data")
    gen = torch.Generator().manual_seed(4)
    w = next(i for i, p in enumerate(part.params) if p is part.module.lm_head.weight)
    v, h = part.module.lm_head.weight.shape
    per_mb = (2 if precision == "bf16-mixed" else 4) * 32 * (v + h)
    chunk = -(-4 * v * h // (2 * per_mb))  # the microbatches whose factors reach half the float32 bytes
    assert 2 <= chunk < 8, chunk
    held = []
    for i in range(chunk + 1):
        part.head_loss(i, torch.randn(2, 16, 128, generator=gen), torch.randint(0, m.dims.vocab, (2, 16),
                                                                                generator=gen), hold=True)
        held.append(part._held[i][w])
        assert part.count_held(i)
        added = bool(part._acc[w].abs().sum() > 0)
        assert added == (i >= chunk - 1), i  # nothing added until the chunk is full
    assert not part.count_held(0)  # (counted once)
    want = torch.zeros(v, h)
    add_all(want, held[:chunk])
    assert torch.equal(part._acc[w], want)
    add_all(want, held[chunk:])
    assert torch.equal(part.grad_vector()[sum(p.numel() for p in part.params[:w]):][:v * h].view(v, h), want)
    part.head_loss("late", torch.randn(2, 16, 128), torch.randint(0, m.dims.vocab, (2, 16)), hold=True)
    part.count_held("late")  # after the gradient vector was taken: cleared with the accumulators by the step
    part.apply_mean_grad(torch.zeros(part.num_params), 1)
    assert not part._counted and float(part.grad_vector().abs().sum()) == 0.0


@pytest.mark.parametrize("family", ["llama", "gpt"])
def test_the_embedding_gradient_is_its_microbatchs_rows(family):
    """embed_backward adds the embedding's gradient as the microbatch's rows (sparse): autograd's dense gradient's
    values (one microbatch: bit for bit), every other row of the table untouched, the modules left dense."""
    m = _manifest(family, "fp32")
    part = build_stage(m, "data")
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 40, (2, 16), generator=gen)
    ids[1, 3] = ids[0, 7]  # a token twice in the microbatch
    grad_h = torch.randn(2, 16, 64, generator=gen)
    with torch.enable_grad():
        want = torch.autograd.grad(part.module.embed(ids), part.params, grad_h, allow_unused=True)
    part.embed("mb", ids)
    nodes, seen = [part._stash["mb"].out.grad_fn], []
    while nodes:  # the lookups the stashed graph records
        fn = nodes.pop()
        if fn is not None:
            seen += [fn._saved_sparse] if type(fn).__name__ == "EmbeddingBackward0" else []
            nodes += [f for f, _ in fn.next_functions]
    assert seen and all(seen)
    part.embed_backward("mb", grad_h)
    embs = [mod for mod in part.module.modules() if isinstance(mod, torch.nn.Embedding)]
    assert embs and not any(mod.sparse for mod in embs)
    table = next(i for i, p in enumerate(part.params) if p is part.module.embed_tokens.weight)
    assert want[table] is not None and not want[table].is_sparse
    got = part.grad_vector()
    ref = torch.cat([(g if g is not None else torch.zeros_like(p)).float().reshape(-1)
                     for g, p in zip(want, part.params)])
    assert torch.equal(got, ref)
    rows = part._acc[table]
    untouched = torch.ones(rows.shape[0], dtype=torch.bool)
    untouched[ids.unique()] = False
    assert rows[untouched].abs().sum() == 0 and rows[~untouched].abs().sum() > 0
