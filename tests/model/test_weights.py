"""Pretrained weights: safetensors (one file or a sharded index) read per part, hash-checked, mismatches refused.

Each node reads only its part's tensors (a spy on `safe_open` counts them);
every part loaded equals the saved model's; a bad hash, a missing tensor, a
wrong shape, a tensor of another config and an unreadable file are each one
ManifestError naming the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import gwtf_node.model.weights as weights_mod
from gwtf_node.model.manifest import ManifestError, RunManifest, default_manifest
from gwtf_node.model.reference import build_chain
from gwtf_node.model.stages import build_full_model, build_stage
from gwtf_node.model.weights import weights_digest


def tiny(family: str = "llama", **config) -> RunManifest:
    m = default_manifest(family=family, stages=2, layers=3, hidden=32, seq_len=16, microbatch_size=2,
                         microbatches_per_iteration=2)
    return dataclasses.replace(m, model=dataclasses.replace(m.model, config={**m.model.config, **config}))


def with_weights(m: RunManifest, path: Path, sha256: str | None = None) -> RunManifest:
    return dataclasses.replace(m, model=dataclasses.replace(m.model, weights=path.name, weights_sha256=sha256),
                               base_dir=str(path.parent))


def trained_state(m: RunManifest) -> dict[str, torch.Tensor]:
    """A state dict unlike the seed's init: the full model, every parameter moved."""
    full = build_full_model(m)
    with torch.no_grad():
        for i, p in enumerate(full.parameters()):
            p.add_(0.01 * (i + 1))
    return {n: p.detach().clone().contiguous() for n, p in full.named_parameters()}  # a tied tensor once


def save_sharded(state: dict[str, torch.Tensor], directory: Path, shards: int = 3) -> Path:
    names = sorted(state)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[s::shards]}
        save_file(part, str(directory / file))
        weight_map.update({n: file for n in part})
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index


def assert_parts_equal(m: RunManifest, state: dict[str, torch.Tensor]) -> None:
    data, relays = build_chain(m)
    for part in (data, *relays):
        alone = build_stage(m, part.role, part.stage)
        assert alone.state_hash() == part.state_hash()
        for n, p in zip(part.names, part.params):
            assert torch.equal(p.detach(), state[n]), n


@pytest.mark.parametrize("family", ["llama", "gpt", "qwen2"])
def test_single_file_round_trip(family: str, tmp_path) -> None:
    m = tiny(family, **({"tie_word_embeddings": True} if family == "qwen2" else {}))
    state = trained_state(m)
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert weights_digest(path) == digest
    assert_parts_equal(with_weights(m, path, digest), state)


def test_sharded_round_trip_and_what_its_hash_covers(tmp_path) -> None:
    m = tiny("llama", num_key_value_heads=2)
    state = trained_state(m)
    index = save_sharded(state, tmp_path)
    shards = sorted({v for v in json.loads(index.read_text())["weight_map"].values()})
    expect = hashlib.sha256(index.read_bytes() + b"".join((tmp_path / s).read_bytes() for s in shards)).hexdigest()
    assert weights_digest(index) == expect
    assert_parts_equal(with_weights(m, index, expect), state)
    # a changed shard changes the hash: every node would refuse it
    save_file({k: v + 1 for k, v in state.items() if k in json.loads(index.read_text())["weight_map"]
               and json.loads(index.read_text())["weight_map"][k] == shards[1]}, str(tmp_path / shards[1]))
    with pytest.raises(ManifestError, match="weights_sha256"):
        build_stage(with_weights(m, index, expect), "relay", 0)


def test_gpt2_checkpoint_names_without_the_base_prefix(tmp_path) -> None:
    """The public GPT-2 checkpoints store `h.0.attn.c_attn.weight` and legacy mask buffers (`h.0.attn.bias`)."""
    m = tiny("gpt")
    state = trained_state(m)
    stripped = {n.removeprefix("transformer."): t for n, t in state.items()}
    stripped["h.0.attn.bias"] = torch.ones(1, 1, 64, 64)
    path = tmp_path / "gpt2.safetensors"
    save_file(stripped, str(path))
    assert_parts_equal(with_weights(m, path), state)


def test_refusals_name_the_key(tmp_path) -> None:
    m = tiny("llama")
    state = trained_state(m)
    good = tmp_path / "good.safetensors"
    save_file(state, str(good))
    with pytest.raises(ManifestError, match=r"sha256 .* model.weights_sha256 is 0{64}"):
        build_stage(with_weights(m, good, "0" * 64), "data")
    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in state.items() if k != "model.layers.2.mlp.up_proj.weight"}, str(missing))
    build_stage(with_weights(m, missing), "relay", 0)  # stage 0 does not need it
    with pytest.raises(ManifestError, match="missing tensor 'model.layers.2.mlp.up_proj.weight'"):
        build_stage(with_weights(m, missing), "relay", 1)
    wrong = tmp_path / "wrong.safetensors"
    save_file({**state, "model.norm.weight": torch.ones(31)}, str(wrong))
    with pytest.raises(ManifestError, match=r"'model.norm.weight' has shape \[31\], the model's is \[32\]"):
        build_stage(with_weights(m, wrong), "data")
    extra = tmp_path / "extra.safetensors"  # a checkpoint of a deeper model: refused on every node, at once
    save_file({**state, "model.layers.3.mlp.up_proj.weight": torch.zeros(2)}, str(extra))
    with pytest.raises(ManifestError, match="unexpected tensor 'model.layers.3.mlp.up_proj.weight'"):
        build_stage(with_weights(m, extra), "relay", 0)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x07" * 64)
    with pytest.raises(ManifestError, match="cannot read model weights"):
        build_stage(with_weights(m, garbage), "data")
    with pytest.raises(ManifestError, match="not found"):
        build_stage(with_weights(m, tmp_path / "absent.safetensors"), "data")
    index = save_sharded(state, tmp_path)
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(ManifestError, match="shard .*model-00002-of-00003.safetensors.* not found"):
        build_stage(with_weights(m, index), "data")


def test_a_node_reads_only_its_own_tensors(tmp_path, monkeypatch) -> None:
    m = tiny("llama", tie_word_embeddings=True)
    state = trained_state(m)
    index = save_sharded(state, tmp_path, shards=2)
    read: list[str] = []
    real = weights_mod.safe_open

    class Spy:
        def __init__(self, *a, **kw):
            self.f = real(*a, **kw)

        def keys(self):
            return self.f.keys()

        def get_slice(self, name):
            return self.f.get_slice(name)  # the header's shape only

        def get_tensor(self, name):
            read.append(name)
            return self.f.get_tensor(name)

    monkeypatch.setattr(weights_mod, "safe_open", Spy)
    man = with_weights(m, index)
    for role, stage in [("data", None), ("relay", 0), ("relay", 1)]:
        read.clear()
        part = build_stage(man, role, stage)
        assert sorted(read) == sorted(part.names), (role, stage)
    assert sorted(build_stage(man, "data").names) == ["model.embed_tokens.weight", "model.norm.weight"]


def test_manifest_field(tmp_path) -> None:
    m = tiny()
    weighted = dataclasses.replace(m, model=dataclasses.replace(m.model, weights="w.safetensors"))
    assert "weights_sha256" not in weighted.to_json()  # absent when unset: existing run ids do not change
    hashed = dataclasses.replace(weighted, model=dataclasses.replace(weighted.model, weights_sha256="ab" * 32))
    assert RunManifest.from_json(hashed.to_json()) == hashed and hashed.run_id != weighted.run_id
    for bad, message in [("AB" * 32, "64 lowercase hex"), ("ab", "64 lowercase hex"), (5, "64 lowercase hex")]:
        d = json.loads(hashed.to_json())
        d["model"]["weights_sha256"] = bad
        with pytest.raises(ManifestError, match=message):
            RunManifest.from_json(json.dumps(d))
    d = json.loads(hashed.to_json())
    d["model"]["weights"] = None
    with pytest.raises(ManifestError, match="weights_sha256 is set but model.weights is not"):
        RunManifest.from_json(json.dumps(d))
