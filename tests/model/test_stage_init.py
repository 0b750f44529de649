"""A part is built alone: only its own parameters, each drawn from (seed, its HF name), for every family.

The checks: parts built one by one equal the centralized reference's parts; the
chain equals the family's own HF model (built by transformers the usual way,
then given the parts' parameters), for LLaMA, GPT-2, Mistral (with a sliding
window shorter than the sequence) and Qwen2 (grouped-query attention, tied
embeddings, sliding-window layers); the initial values follow transformers'
distributions; what cannot be cut is refused naming the key; and a relay of a
4-stage ~127M-parameter model grows a fresh process's memory by at most 0.35
of the whole model's fp32 training state, and by less than the whole model's
parameters (which building the whole model and cutting it needed).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gwtf_node.model.data import MicrobatchSource
from gwtf_node.model.manifest import ManifestError, RunManifest, default_manifest
from gwtf_node.model.materialize import build_skeleton, parameter_seed
from gwtf_node.model.reference import build_chain, run_microbatch
from gwtf_node.model.stages import build_stage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny(family: str, **config) -> RunManifest:
    m = default_manifest(family=family, stages=2, layers=3, hidden=32, seq_len=16, microbatch_size=2,
                         microbatches_per_iteration=2)
    return dataclasses.replace(m, model=dataclasses.replace(m.model, config={**m.model.config, **config}))


# LLaMA with grouped-query attention and tied embeddings; GPT-2; Mistral whose window (8) is shorter than the
# sequence (16); Qwen2 with GQA, tied embeddings, q/k/v biases and sliding-window layers from layer 1 on
CASES = {
    "llama": tiny("llama", num_key_value_heads=2, tie_word_embeddings=True),
    "gpt": tiny("gpt"),
    "mistral": tiny("mistral", num_key_value_heads=2, sliding_window=8),
    "qwen2": tiny("qwen2", num_key_value_heads=1, tie_word_embeddings=True, use_sliding_window=True,
                  sliding_window=8, max_window_layers=1),
}


def _hf_model(m: RunManifest):
    """The family's HF model built by transformers itself (its own init), in eval mode."""
    import transformers

    from gwtf_node.model.families import family

    fam = family(m.model.family)
    config = getattr(transformers, fam.config_class)(**m.model.config)
    return getattr(transformers, fam.model_class)(config).eval()


@pytest.mark.parametrize("family", list(CASES))
def test_parts_built_alone_equal_the_reference_parts(family: str) -> None:
    m = CASES[family]
    data, relays = build_chain(m)
    assert build_stage(m, "data").state_hash() == data.state_hash()
    for k, relay in enumerate(relays):
        alone = build_stage(m, "relay", k)
        assert alone.names == relay.names and alone.state_hash() == relay.state_hash()
        assert not any(t.is_meta for t in (*alone.module.parameters(), *alone.module.buffers()))
    # a relay holds its layers only: names and sizes add up to the HF model's
    hf = _hf_model(m)
    assert sum(p.num_params for p in (data, *relays)) == sum(p.numel() for p in hf.parameters())
    assert sorted(n for p in (data, *relays) for n in p.names) == sorted(n for n, _ in hf.named_parameters())
    start, end = m.stages[1]
    assert {n.split(".")[2] for n in relays[1].names} == {str(i) for i in range(start, end)}


@pytest.mark.parametrize("family", list(CASES))
def test_chain_equals_the_hf_model_given_the_same_parameters(family: str) -> None:
    m = CASES[family]
    data, relays = build_chain(m)
    hf = _hf_model(m)
    values = {n: p.detach() for part in (data, *relays) for n, p in zip(part.names, part.params)}
    missing, unexpected = hf.load_state_dict(values, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing)  # a tied head is loaded as the embedding
    if m.dims.tied:
        assert data.module.lm_head.weight is data.module.embed_tokens.weight and "lm_head.weight" not in data.names
        assert hf.lm_head.weight is hf.get_input_embeddings().weight
    else:
        assert data.module.lm_head.weight is not data.module.embed_tokens.weight
    window = MicrobatchSource.for_manifest(m, 0, 1).shard[: 2 * 17].reshape(2, 17)
    x, y = window[:, :-1], window[:, 1:]
    loss = run_microbatch(data, relays, "k", x, y)
    logits = hf(input_ids=x).logits
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    assert loss == pytest.approx(ref.item(), rel=1e-5)
    ref.backward()
    grads = {n: p.grad for n, p in hf.named_parameters()}
    for part in (data, *relays):
        expect = torch.cat([grads[n].reshape(-1) for n in part.names])
        torch.testing.assert_close(part.grad_vector(), expect, rtol=1e-4, atol=1e-6)


def test_sliding_window_changes_what_is_computed() -> None:
    """The Mistral case's window (8 < 16 tokens) matters: without it the same parameters give another loss, so the
    test above checks the relays apply the window as the HF model does."""
    m = CASES["mistral"]
    no_window = dataclasses.replace(m, model=dataclasses.replace(m.model, config={**m.model.config,
                                                                                   "sliding_window": None}))
    x = MicrobatchSource.for_manifest(m, 0, 1).shard[:32].reshape(2, 16)
    losses = []
    for man in (m, no_window):
        data, relays = build_chain(man)
        losses.append(run_microbatch(data, relays, "k", x, x))
    assert losses[0] != pytest.approx(losses[1], rel=1e-6)


def test_initial_values_follow_transformers_distributions() -> None:
    m = tiny("gpt", n_layer=8, n_embd=64, vocab_size=512)
    m = dataclasses.replace(m, stages=[(0, 4), (4, 8)])
    data, relays = build_chain(m)
    values = {n: p.detach() for part in (data, *relays) for n, p in zip(part.names, part.params)}
    std = 0.02
    assert values["transformer.wte.weight"].std().item() == pytest.approx(std, rel=0.05)
    assert values["transformer.h.5.mlp.c_fc.weight"].std().item() == pytest.approx(std, rel=0.05)
    scaled = std / math.sqrt(2 * 8)  # GPT-2's residual projections
    assert values["transformer.h.5.attn.c_proj.weight"].std().item() == pytest.approx(scaled, rel=0.1)
    assert values["transformer.h.5.mlp.c_proj.weight"].std().item() == pytest.approx(scaled, rel=0.1)
    assert torch.equal(values["transformer.h.5.ln_1.weight"], torch.ones(64))
    assert torch.equal(values["transformer.h.5.attn.c_attn.bias"], torch.zeros(192))
    # each parameter is its own generator's draw: a name's values do not depend on what else was built
    g = torch.Generator().manual_seed(parameter_seed(m.train.seed, "transformer.h.5.mlp.c_fc.weight"))
    assert torch.equal(values["transformer.h.5.mlp.c_fc.weight"], torch.empty(64, 256).normal_(0, std, generator=g))
    # LLaMA: a pad token's embedding row is zero (as transformers initialises it); the rotary inv_freq is HF's
    pad = tiny("llama", pad_token_id=3, initializer_range=0.05)
    data = build_stage(pad, "data")
    emb = data.module.embed_tokens.weight
    assert torch.equal(emb[3], torch.zeros(32)) and emb.std().item() == pytest.approx(0.05, rel=0.1)
    relay = build_stage(pad, "relay", 0)
    torch.testing.assert_close(relay.module.rotary_emb.inv_freq, _hf_model(pad).model.rotary_emb.inv_freq,
                               rtol=0, atol=0)
    other_seed = dataclasses.replace(pad, train=dataclasses.replace(pad.train, seed=7))
    assert build_stage(other_seed, "relay", 0).state_hash() != relay.state_hash()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: parts drawn for cuda equal the CPU's")
def test_a_cuda_node_holds_the_cpu_numbers() -> None:
    m = CASES["qwen2"]
    for role, stage in [("data", None), ("relay", 0), ("relay", 1)]:
        on_gpu = build_stage(m, role, stage, device="cuda")
        assert all(t.is_cuda for t in (*on_gpu.module.parameters(), *on_gpu.module.buffers()))
        assert on_gpu.state_hash() == build_stage(m, role, stage).state_hash()


def test_the_skeleton_has_no_storage() -> None:
    m = default_manifest(family="llama", stages=4, layers=8, hidden=1024, seq_len=64)
    skeleton = build_skeleton(m)
    assert all(p.is_meta for p in skeleton.parameters())
    assert sum(p.numel() for p in skeleton.parameters()) > 100_000_000  # ~0.4 GB had it been allocated


@pytest.mark.parametrize("family, key, value, message", [
    ("qwen2", "num_experts", 8, "model.config.num_experts"),
    ("mistral", "num_local_experts", 8, "model.config.num_local_experts"),
    ("llama", "model_type", "qwen2", "model.config.model_type"),
    ("gpt", "add_cross_attention", True, "model.config.add_cross_attention"),
    ("llama", "num_key_value_heads", 3, "model.config.num_key_value_heads"),
    ("qwen2", "tie_word_embeddings", "yes", "model.config.tie_word_embeddings"),
])
def test_what_cannot_be_cut_is_refused_naming_the_key(family: str, key: str, value, message: str) -> None:
    m = tiny(family)
    d = json.loads(m.to_json())
    d["model"]["config"][key] = value
    with pytest.raises(ManifestError, match=message):
        RunManifest.from_json(json.dumps(d))


def test_families_and_dims() -> None:
    q = CASES["qwen2"]
    assert q.dims.kv_heads == 1 and q.dims.tied and q.dims.heads == 4
    assert CASES["gpt"].dims.tied and CASES["gpt"].dims.kv_heads == CASES["gpt"].dims.heads
    assert not tiny("llama").dims.tied
    assert RunManifest.from_json(q.to_json()) == q


# ---- memory ----------------------------------------------------------------------------

MEMORY_PROBE = textwrap.dedent("""
    import json, resource, sys
    import torch, transformers  # the baseline: a process that imported torch and transformers
    torch.set_num_threads(1)

    def peak():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    from gwtf_node.model.manifest import RunManifest
    from gwtf_node.model.stages import build_stage
    m = RunManifest.from_json(sys.argv[1])
    role, stage = sys.argv[2], (None if sys.argv[3] == "-" else int(sys.argv[3]))
    import transformers.models.llama.modeling_llama, transformers.masking_utils  # code, not the model's memory
    base = peak()
    part = build_stage(m, role, stage)
    if role == "relay":
        x = torch.randn(part.expected_hidden_shape())
        out = part.forward("k", x)
        part.backward("k", torch.ones_like(out))
    else:
        ids = torch.zeros(m.data.microbatch_size, m.data.seq_len, dtype=torch.long)
        h = part.embed("k", ids)
        _, g = part.head_loss("k", h, ids)
        part.embed_backward("k", g)
    print(json.dumps({"base": base, "peak": peak(), "part_params": part.num_params}))
""")


def model_127m(stages: int = 4) -> RunManifest:
    """The LLaMA-family shape of a ~127M model (SmolLM-135M-like: GQA 9/3 heads, tied embeddings)."""
    m = default_manifest(family="llama", stages=stages, layers=28, hidden=576, seq_len=32, microbatch_size=1,
                         microbatches_per_iteration=1)
    config = {**m.model.config, "vocab_size": 49152, "intermediate_size": 1536, "num_attention_heads": 9,
              "num_key_value_heads": 3, "tie_word_embeddings": True, "max_position_embeddings": 2048}
    return dataclasses.replace(m, model=dataclasses.replace(m.model, config=config))


def measure_part(m: RunManifest, role: str, stage: int | None, pythonpath: str = ROOT) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", MEMORY_PROBE, m.to_json(indent=None), role,
                           "-" if stage is None else str(stage)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=pythonpath)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_relay_allocates_about_its_quarter() -> None:
    m = model_127m()
    n_params = sum(p.numel() for p in build_skeleton(m).parameters())
    assert 120e6 < n_params < 135e6
    training_state = 16 * n_params  # fp32 parameters, gradients and Adam's two moments
    r = measure_part(m, "relay", 1)
    growth = r["peak"] - r["base"]
    assert r["part_params"] < n_params / 4
    assert growth <= 0.35 * training_state, f"relay grew {growth / 1e6:.0f} MB, the model's state is " \
                                            f"{training_state / 1e6:.0f} MB"
    # and it never held the whole model: building it all first (and cutting) needs its 4 bytes per parameter
    assert growth < 4 * n_params, f"relay grew {growth / 1e6:.0f} MB, the whole model is {4 * n_params / 1e6:.0f} MB"
