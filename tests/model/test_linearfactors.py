"""model/linearfactors.py: a relay's linear weights' gradients, held as their factors, are bit for bit what autograd
computes for the stage, and take a fraction of the memory."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gwtf_node.model.linearfactors import Factors, add_all, materialized
from gwtf_node.model.hfconfig import family_config
from gwtf_node.model.manifest import default_manifest
from gwtf_node.model.stages import build_stage

LLAMA_GQA = {"model_type": "llama", "vocab_size": 300, "hidden_size": 96, "intermediate_size": 160,
             "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2}
GPT = {"model_type": "gpt2", "vocab_size": 300, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 200,
       "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
QWEN2 = {**LLAMA_GQA, "model_type": "qwen2"}  # biases on q, k, v
CONFIGS = {"llama-gqa": LLAMA_GQA, "gpt2": GPT, "qwen2": QWEN2}


def _part(raw: dict, precision: str, seq_len: int = 8):
    family, config, _ = family_config(raw)
    m = default_manifest(family=family, config=config, stages=1, seq_len=seq_len, microbatch_size=2)
    wire = "bf16" if precision == "bf16-mixed" else "fp32"
    m = dataclasses.replace(m, train=dataclasses.replace(m.train, precision=precision, wire_dtype=wire))
    return build_stage(m, "relay", 0)


def _autograd_stage(part, x, dy):
    """The stage forward and backward as plain autograd (the layers' own forwards, every parameter asked for)."""
    inp = x.detach().float().requires_grad_(True)
    with torch.enable_grad(), part._compute():
        out = part.module(inp)
    g_in, *grads = torch.autograd.grad(out, [inp, *part.params], dy.to(out.dtype), allow_unused=True)
    return out.detach().to(part.wire_dtype), g_in.detach().to(part.wire_dtype), grads


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_relays_gradients_are_autograds_bit_for_bit_held_or_not(name: str, precision: str) -> None:
    part = _part(CONFIGS[name], precision)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 8, part.hidden_size, generator=gen)
    dy = torch.randn(2, 8, part.hidden_size, generator=gen).to(part.wire_dtype)  # as it comes off the wire
    want_out, want_in, want = _autograd_stage(part, x, dy)

    out = part.forward("held", x)
    assert torch.equal(out, want_out)
    assert torch.equal(part.backward("held", dy, hold=True), want_in)
    held = part._held["held"]
    factored = [g for g in held if isinstance(g, Factors)]
    linears = [m for m in part.module.modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"]
    assert len(factored) == len(linears) > 0
    for got, ref in zip(held, want):
        assert (got is None) == (ref is None) and (ref is None or torch.equal(materialized(got), ref.float()))

    part.forward("at once", x)  # not held: added to the accumulators at once
    part.backward("at once", dy)
    acc = part.grad_vector()
    assert torch.equal(acc, torch.cat([(g if g is not None else torch.zeros_like(p)).float().reshape(-1)
                                       for g, p in zip(want, part.params)]))
    assert part.commit("held")
    assert torch.equal(part.grad_vector(), acc + acc)


def test_the_factors_are_a_fraction_of_the_gradients_and_long_sequences_hold_the_gradients() -> None:
    short = _part(LLAMA_GQA, "bf16-mixed", seq_len=8)
    short.forward("k", torch.randn(2, 8, short.hidden_size))
    short.backward("k", torch.randn(2, 8, short.hidden_size).to(short.wire_dtype), hold=True)
    held = [g for g in short._held["k"] if isinstance(g, Factors)]
    factored = sum(4 * p.numel() for p, g in zip(short.params, short._held["k"]) if isinstance(g, Factors))
    distinct = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for f in held for t in (f.grad_out, f.inp)}
    assert held and sum(distinct.values()) < factored / 6  # 16 tokens against widths 96-160: 7.9x

    long = _part(LLAMA_GQA, "fp32", seq_len=512)  # 1,024 tokens: the factors outweigh the 96 x 160 weights
    long.forward("k", torch.randn(2, 512, long.hidden_size))
    long.backward("k", torch.randn(2, 512, long.hidden_size), hold=True)
    assert not any(isinstance(g, Factors) for g in long._held["k"])


def test_the_weights_compute_copy_is_made_once_per_step_and_follows_the_weights() -> None:
    part = _part(LLAMA_GQA, "bf16-mixed")
    x = torch.randn(2, 8, part.hidden_size)
    part.forward("a", x)
    copies = part._factors.cast_bytes
    assert copies == 2 * sum(p.numel() for i, p in enumerate(part.params) if i in part._factors.factored)
    part.forward("b", x)  # a second microbatch reuses the copies
    assert part._factors.cast_bytes == copies
    for k in ("a", "b"):
        part.backward(k, torch.randn(2, 8, part.hidden_size).to(part.wire_dtype), hold=True)
    assert part.commit("a") and part.commit("b")
    part.apply_mean_grad(part.grad_vector(), 2)  # the step changes the weights: the copies go, and are remade
    assert part._factors.cast_bytes == 0
    want_out, _, _ = _autograd_stage(part, x, torch.zeros_like(x))
    assert torch.equal(part.forward("c", x), want_out)
    with torch.no_grad():  # a weight changed in place elsewhere: its copy is remade (the version counter)
        part.params[1].mul_(2)
    want_out, _, _ = _autograd_stage(part, x, torch.zeros_like(x))
    assert torch.equal(part.forward("d", x), want_out)


def test_a_layer_called_twice_in_one_forward_is_refused() -> None:
    part = _part(LLAMA_GQA, "fp32")
    layer = part.module.layers[0]
    mlp = layer.mlp.down_proj
    twice = mlp.forward
    layer.mlp.down_proj.forward = lambda h: twice(twice(h[..., :mlp.in_features])[..., :0].sum() + h)  # noqa: E731
    part.forward("k", torch.randn(2, 8, part.hidden_size))
    with pytest.raises(RuntimeError, match="ran twice"):
        part.backward("k", torch.randn(2, 8, part.hidden_size), hold=True)


def test_add_all_multiplies_runs_of_factors_out_in_chunks_within_the_products_bytes() -> None:
    gen = torch.Generator().manual_seed(0)

    def f(n: int) -> Factors:  # [n, 6] x [n, 4]: a product of 24 float32 (96 bytes); n tokens take 40 n bytes
        return Factors(torch.randn(n, 6, generator=gen), torch.randn(n, 4, generator=gen))

    def cat(*fs: Factors) -> torch.Tensor:
        return Factors(torch.cat([x.grad_out for x in fs]), torch.cat([x.inp for x in fs])).product()

    a, b, c, d, e = f(1), f(1), f(1), f(2), f(1)
    t = torch.randn(6, 4, generator=gen)
    acc = torch.zeros(6, 4)
    add_all(acc, [a, b, None, c, d, t, e])  # (a, b) 80 bytes; c alone (c + d: 120 > 96); d; t; e
    want = torch.zeros(6, 4)
    for g in (cat(a, b), c.product(), d.product(), t, e.product()):
        want.add_(g)
    assert torch.equal(acc, want)
    big = f(5)  # a single factor over the product's size is still multiplied out, alone
    acc = torch.zeros(6, 4)
    add_all(acc, [a, big, b])
    assert torch.equal(acc, torch.zeros(6, 4).add_(a.product()).add_(big.product()).add_(b.product()))


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_commit_many_adds_the_held_keys_in_order_and_skips_the_others(precision: str) -> None:
    part = _part(LLAMA_GQA, precision)
    gen = torch.Generator().manual_seed(1)
    keys = [f"m{i}" for i in range(6)]
    per_key = []
    for k in keys:
        x = torch.randn(2, 8, part.hidden_size, generator=gen)
        dy = torch.randn(2, 8, part.hidden_size, generator=gen)
        part.forward(k, x.to(part.wire_dtype))
        part.backward(k, dy.to(part.wire_dtype), hold=True)
        per_key.append([materialized(g) for g in part._held[k]])
    part.discard("m5")
    assert part.commit_many(["m4", "m0", "unknown", "m2", "m5"]) == 3
    assert sorted(part.held) == ["m1", "m3"] and part.accumulated == 3
    for j, acc in enumerate(part._acc):
        want = sum(per_key[i][j] for i in (4, 0, 2) if per_key[i][j] is not None)
        if isinstance(want, torch.Tensor):  # (the same sum; one product per chunk rounds it once)
            err = float((acc - want).norm() / want.norm())
            assert err < (4e-3 if precision == "bf16-mixed" else 1e-6), (j, err)
