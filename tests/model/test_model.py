"""The torch layer: manifests, stage partitioning, stage execution, data and tensors on the wire.

The central checks: the chained stages compute the plain HF model (loss and
gradients), and the decentralized bookkeeping (microbatches spread over
separate copies of each part, gradient vectors summed, the same mean step
applied everywhere) lands on the parameters of the centralized reference.
Models are tiny (hidden 32, two one-layer stages, 16 tokens) to keep this fast.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf_node.model.data import ByteTokenizer, MicrobatchSource, bundled_text, encode_corpus
from gwtf_node.model.manifest import (
    ManifestError,
    RunManifest,
    TrainSpec,
    default_manifest,
    load_manifest,
    partition_layers,
    save_manifest,
    sign_manifest,
    verify_manifest,
)
from gwtf_node.model.reference import build_chain, make_sources, run_microbatch, train_centralized
from gwtf_node.model.stages import build_full_model, build_stage
from gwtf_node.model.tensors import TensorError, pack, unpack
from gwtf_node.protocol.messages import TensorHeader

FAMILIES = ("llama", "gpt")


def tiny(family: str = "llama", **kw) -> RunManifest:
    args = dict(family=family, stages=2, layers=2, hidden=32, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    args.update(kw)
    return default_manifest(**args)


def with_data(m: RunManifest, **kw) -> RunManifest:
    return dataclasses.replace(m, data=dataclasses.replace(m.data, **kw))


# ---- partition ----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64))
def test_partition_is_balanced_contiguous_and_covering(n_layers: int, n_stages: int) -> None:
    if n_stages > n_layers:
        with pytest.raises(ManifestError, match="lower the stages"):
            partition_layers(n_layers, n_stages)
        return
    parts = partition_layers(n_layers, n_stages)
    assert len(parts) == n_stages
    assert parts[0][0] == 0 and parts[-1][1] == n_layers
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    sizes = [e - s for s, e in parts]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger stages first


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=12), st.integers(1, 12))
def test_weighted_partition_minimizes_the_bottleneck(weights: list[int], n_stages: int) -> None:
    n = len(weights)
    if n_stages > n:
        return
    parts = partition_layers(n, n_stages, weights)
    assert parts[0][0] == 0 and parts[-1][1] == n and all(a[1] == b[0] < b[1] for a, b in zip(parts, parts[1:]))
    bottleneck = max(sum(weights[s:e]) for s, e in parts)
    # no cut is better: brute force over all cuts for small cases
    import itertools

    best = min(
        max(sum(weights[s:e]) for s, e in zip((0, *cuts), (*cuts, n)))
        for cuts in itertools.combinations(range(1, n), n_stages - 1)
    )
    assert bottleneck == best


def test_partition_with_heavy_layers_and_errors() -> None:
    assert partition_layers(4, 2, [10, 1, 1, 1]) == [(0, 1), (1, 4)]
    assert partition_layers(5, 1) == [(0, 5)]
    for n, s in [(3, 0), (0, 1), (2, 3), (3, -1)]:
        with pytest.raises(ManifestError):
            partition_layers(n, s)
    with pytest.raises(ManifestError, match="weights"):
        partition_layers(3, 2, [1, 2])


# ---- manifest ---------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_manifest_round_trip(family: str, tmp_path) -> None:
    m = tiny(family)
    again = RunManifest.from_json(m.to_json())
    assert again == m and again.run_id == m.run_id and len(m.run_id) == 16
    assert again.to_json() == m.to_json()
    assert json.loads(m.to_json()) == json.loads(m.to_json(indent=None))
    save_manifest(m, tmp_path / "run.json")
    assert load_manifest(tmp_path / "run.json") == m
    assert tiny(family, lr=1e-3).run_id != m.run_id


def _broken(edit) -> str:
    d = json.loads(tiny().to_json())
    edit(d)
    return json.dumps(d)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["model"].update(family="bert"), "family"),
        (lambda d: d.update(stages=[[0, 1], [2, 2]]), "starts at layer 2"),
        (lambda d: d.update(stages=[[0, 1]]), "model has 2 layers"),
        (lambda d: d.update(stages=[[0, 0], [0, 2]]), "at least one layer"),
        (lambda d: d.update(stages=[]), "stages is empty"),
        (lambda d: d.update(stages=[[0, 1, 2], [1, 2]]), "pair"),
        (lambda d: d["data"].update(seq_len=0), "data.seq_len"),
        (lambda d: d["data"].update(microbatch_size=-2), "data.microbatch_size"),
        (lambda d: d["data"].update(microbatches_per_iteration=1.5), "microbatches_per_iteration"),
        (lambda d: d["data"].update(seq_len=100000), "positions"),
        (lambda d: d["data"].update(source="web"), "bundled"),
        (lambda d: d["data"].update(source=["notes.pdf"]), ".txt or .jsonl"),
        (lambda d: d["model"]["config"].update(hidden_size=30), "divisible"),
        (lambda d: d["model"]["config"].update(num_hidden_layers=0), "positive integer"),
        (lambda d: d["model"]["config"].update(vocab_size=100), "byte tokenizer"),
        (lambda d: d["model"]["config"].update(attention_dropout=0.1), "dropout"),
        (lambda d: d["train"].update(optimizer="lion"), "optimizer"),
        (lambda d: d["train"].update(lr=0), "train.lr"),
        (lambda d: d["train"].update(betas=[0.9]), "betas"),
        (lambda d: d["train"].update(momentun=0.9), "train has unknown field"),
        (lambda d: d.update(owner_public_key="xyz"), "64 hex"),
        (lambda d: d.pop("data"), "missing the field 'data'"),
        (lambda d: d.update(extra=1), "unknown field"),
        (lambda d: d.update(version=99), "version 99"),
    ],
)
def test_manifest_validation_errors(edit, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        RunManifest.from_json(_broken(edit))


def test_manifest_file_errors(tmp_path) -> None:
    with pytest.raises(ManifestError, match="not valid JSON"):
        RunManifest.from_json("{nope")
    with pytest.raises(ManifestError, match="cannot read manifest"):
        load_manifest(tmp_path / "absent.json")
    m = with_data(tiny(), source=["corpus.txt"])
    save_manifest(m, tmp_path / "run.json")
    with pytest.raises(ManifestError, match="corpus.txt"):
        load_manifest(tmp_path / "run.json")
    assert load_manifest(tmp_path / "run.json", check_files=False) == m  # a relay opens no data files
    (tmp_path / "corpus.txt").write_text("hello")
    assert load_manifest(tmp_path / "run.json") == m  # relative to the manifest's directory
    weighted = dataclasses.replace(m, model=dataclasses.replace(m.model, weights="w.safetensors"))
    with pytest.raises(ManifestError, match="model weights file"):
        RunManifest.from_json(weighted.to_json(), check_files=True, base_dir=str(tmp_path))


def test_signing_and_tampering() -> None:
    key = Ed25519PrivateKey.generate()
    m = tiny()
    verify_manifest(m)  # unsigned, no owner: fine
    signed = sign_manifest(m, key)
    verify_manifest(signed)
    verify_manifest(RunManifest.from_json(signed.to_json()))
    assert signed.run_id != m.run_id  # the owner is part of the run's identity
    assert dataclasses.replace(signed, signature="ab" * 64).run_id == signed.run_id  # the signature is not
    tampered = dataclasses.replace(signed, train=dataclasses.replace(signed.train, lr=1.0))
    with pytest.raises(ManifestError, match="altered"):
        verify_manifest(tampered)
    with pytest.raises(ManifestError, match="altered"):
        verify_manifest(dataclasses.replace(signed, signature="00" * 64))
    other = sign_manifest(m, Ed25519PrivateKey.generate())
    with pytest.raises(ManifestError, match="altered"):
        verify_manifest(dataclasses.replace(other, owner_public_key=signed.owner_public_key))
    with pytest.raises(ManifestError, match="not signed"):
        verify_manifest(dataclasses.replace(signed, signature=""))
    with pytest.raises(ManifestError, match="no owner"):
        verify_manifest(dataclasses.replace(signed, owner_public_key=""))


# ---- stages == the HF model ------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_stage_chain_equals_the_hf_model(family: str) -> None:
    m = tiny(family, stages=2, layers=3)  # stages of 2 and 1 layers
    data, relays = build_chain(m)
    full = build_full_model(m)  # built again: the same seed gives the same weights
    window = MicrobatchSource.for_manifest(m, 0, 1).shard[: 2 * 17].reshape(2, 17)
    x, y = window[:, :-1], window[:, 1:]
    loss = run_microbatch(data, relays, "k", x, y)
    hf = full(input_ids=window, labels=window)  # HF shifts the labels itself
    assert loss == pytest.approx(hf.loss.item(), rel=1e-5)
    torch.nn.functional.cross_entropy(full(input_ids=x).logits.reshape(-1, 256), y.reshape(-1)).backward()
    grads = {n: p.grad for n, p in full.named_parameters()}
    for part in (data, *relays):
        ref = torch.cat([grads[n].reshape(-1) for n in part.names])
        torch.testing.assert_close(part.grad_vector(), ref, rtol=1e-5, atol=1e-7)
    assert sum(p.num_params for p in (data, *relays)) == sum(p.numel() for p in full.parameters())
    if family == "gpt":  # the tie survives: one tensor, the embedding, serves as LM head
        assert data.module.lm_head.weight is data.module.embed_tokens.weight
        assert "lm_head.weight" not in data.names


def test_every_node_builds_the_same_part() -> None:
    m = tiny()
    assert build_stage(m, "relay", 1).state_hash() == build_stage(m, "relay", 1).state_hash()
    assert build_stage(m, "relay", 0).state_hash() != build_stage(m, "relay", 1).state_hash()
    other_seed = dataclasses.replace(m, train=dataclasses.replace(m.train, seed=1))
    assert build_stage(m, "data").state_hash() != build_stage(other_seed, "data").state_hash()
    with pytest.raises(ValueError, match="stages 0..1"):
        build_stage(m, "relay", 2)
    with pytest.raises(ValueError, match="role"):
        build_stage(m, "worker", 0)


def test_profiling_a_part_changes_nothing_of_it() -> None:
    """`profile_ms` (Equation 1's compute time at start) runs forward and backward on random input, and leaves
    the part, its gradients and the random number generator as they were."""
    m = tiny()
    data, relays = build_chain(m)
    for part in (data, *relays):
        before, rng = part.state_hash(), torch.get_rng_state()
        ms = part.profile_ms()
        assert 0.0 < ms < 60_000.0
        assert part.state_hash() == before and torch.equal(torch.get_rng_state(), rng)
        assert part.in_flight == 0 and part.accumulated == 0 and all(p.grad is None for p in part.params)
        assert not any(bool(a.any()) for a in part._acc)


def test_stage_refuses_misuse() -> None:
    m = tiny()
    data, relays = build_chain(m)
    h = data.embed("a", torch.zeros(2, 16, dtype=torch.long))
    assert h.shape == data.expected_hidden_shape() == (2, 16, 32)
    with pytest.raises(RuntimeError, match="relay-node"):
        data.forward("a", h)
    with pytest.raises(RuntimeError, match="data-node"):
        relays[0].embed("a", torch.zeros(2, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="expected"):
        relays[0].forward("a", torch.zeros(2, 16, 31))
    relays[0].forward("a", h)
    with pytest.raises(ValueError, match="shape"):
        relays[0].backward("a", torch.zeros(1, 16, 32))
    with pytest.raises(KeyError, match="no stashed forward"):
        relays[1].backward("zzz", h)


def test_dropped_microbatch_contributes_nothing() -> None:
    m = tiny()
    data, relays = build_chain(m)
    src = MicrobatchSource.for_manifest(m, 0, 1)
    x, y = src.get(0)
    h = relays[0].forward("dropped", data.embed("dropped", x))
    assert relays[0].drop("dropped") and data.drop("dropped") and not relays[0].drop("dropped")
    assert relays[0].in_flight == 0 and relays[0].grad_vector().abs().sum() == 0
    before = relays[0].param_vector()
    assert relays[0].apply_mean_grad(relays[0].grad_vector(), 0) == 0  # nothing completed: no step
    assert torch.equal(relays[0].param_vector(), before)
    run_microbatch(data, relays, "kept", x, y)
    assert relays[0].accumulated == 1 and relays[0].grad_vector().abs().sum() > 0
    relays[0].forward("stale", h)
    assert relays[0].apply_mean_grad(relays[0].grad_vector(), 1) == 1  # the step drops the stale stash
    assert not torch.equal(relays[0].param_vector(), before)


# ---- decentralized bookkeeping == centralized reference --------------------------


@pytest.mark.parametrize("family, data_nodes", [("llama", 1), ("gpt", 2)])
def test_split_accumulation_matches_the_centralized_reference(family: str, data_nodes: int) -> None:
    """Each part has two copies (two relays per stage, two data-node copies); microbatches alternate."""
    m = tiny(family, microbatches_per_iteration=3)
    iterations = 2
    ref = train_centralized(m, iterations, data_nodes=data_nodes)
    copies = [build_chain(m) for _ in range(2)]
    sources = make_sources(m, data_nodes)
    M = m.data.microbatches_per_iteration
    losses = []
    for t in range(iterations):
        mb = [(i, seq) for i, _ in enumerate(sources) for seq in range(t * M, (t + 1) * M)]
        step_losses = []
        for n, (i, seq) in enumerate(mb):
            data, relays = copies[n % 2]
            x, y = sources[i].get(seq)
            step_losses.append(run_microbatch(data, relays, (i, seq), x, y))
        losses.append(sum(step_losses) / len(step_losses))
        parts = list(zip(*[(d, *r) for d, r in copies]))  # per part: its two copies
        for same in parts:
            total = sum(sorted((c.grad_vector() for c in same), key=lambda v: v.sum().item()))
            for c in same:
                c.apply_mean_grad(total, len(mb))
    assert losses == pytest.approx(ref.losses, rel=1e-6)
    assert ref.samples == [data_nodes * M * m.data.microbatch_size] * iterations
    # The gradient sums differ from the reference's only in summation order (~1e-7 relative), but
    # Adam divides by sqrt(v): on a coordinate whose gradient is ~eps that difference becomes a
    # visible fraction of lr.  So parameters agree to 1e-5 absolute (lr is 3e-3), not bitwise.
    data, relays = copies[0]
    for part in (data, *relays):
        torch.testing.assert_close(part.param_vector(), ref.params[part.name], rtol=1e-5, atol=1e-5)
    assert ref.losses[-1] < ref.losses[0]
    # both copies of each part hold identical weights after identical steps
    assert [p.state_hash() for p in (copies[0][0], *copies[0][1])] == [
        p.state_hash() for p in (copies[1][0], *copies[1][1])
    ]


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_state_bytes_hand_over_weights_and_optimizer(optimizer: str) -> None:
    m = tiny()
    m = dataclasses.replace(m, train=TrainSpec(optimizer=optimizer, lr=1e-2, momentum=0.9, weight_decay=0.01))
    data, relays = build_chain(m)
    src = MicrobatchSource.for_manifest(m, 0, 1)

    def step(data, relays, seq):
        run_microbatch(data, relays, seq, *src.get(seq))
        for p in (data, *relays):
            p.apply_mean_grad(p.grad_vector(), 1)

    step(data, relays, 0)
    fresh_data, fresh_relays = build_chain(m)
    for old, new in zip((data, *relays), (fresh_data, *fresh_relays)):
        new.load_state_bytes(old.state_bytes())
        assert new.state_hash() == old.state_hash() and new.steps == 1
    step(data, relays, 1)
    step(fresh_data, fresh_relays, 1)  # momentum / Adam moments came along: the next step is identical
    for old, new in zip((data, *relays), (fresh_data, *fresh_relays)):
        assert torch.equal(old.param_vector(), new.param_vector())
    with pytest.raises(ValueError, match="stage0 of run"):
        relays[1].load_state_bytes(relays[0].state_bytes())
    with pytest.raises(ValueError, match="not readable"):
        relays[0].load_state_bytes(b"garbage")


# ---- tensors on the wire ------------------------------------------------------------


@pytest.mark.parametrize(
    "t",
    [
        torch.randn(2, 3, 4),
        torch.randn(5).to(torch.bfloat16),
        torch.randn(3, 2).to(torch.float16),
        torch.randn(2, 2).double(),
        torch.arange(6).reshape(2, 3),
        torch.arange(6, dtype=torch.int32),
        torch.tensor([0, 255], dtype=torch.uint8),
        torch.tensor([True, False, True]),
        torch.zeros(0, 4),
        torch.tensor(3.5),
        torch.randn(4, 6).t(),  # not contiguous
    ],
    ids=lambda t: f"{t.dtype}{tuple(t.shape)}",
)
def test_tensor_round_trip(t: torch.Tensor) -> None:
    header, payload = pack(t)
    assert header.nbytes == len(payload) == t.numel() * t.element_size()
    for buf in (bytes(payload), bytearray(payload), memoryview(bytearray(payload))):
        out = unpack(header, buf, expect_shape=tuple(t.shape), expect_dtype=t.dtype)
        assert out.dtype == t.dtype and torch.equal(out, t)


def test_unpack_is_zero_copy_for_a_writable_buffer() -> None:
    header, payload = pack(torch.randn(4, 4))
    buf = bytearray(payload)
    out = unpack(header, buf)
    buf[0:4] = bytes(4)
    assert out.reshape(-1)[0].item() == 0.0  # the tensor aliases the buffer
    frame = bytearray(1) + bytearray(payload)  # unaligned inside a larger frame: copied, still correct
    assert torch.equal(unpack(header, memoryview(frame)[1:]), torch.frombuffer(bytearray(payload), dtype=torch.float32).reshape(4, 4))


def test_unpack_refusals() -> None:
    good, payload = pack(torch.ones(2, 3))
    data = bytes(payload)

    def h(**kw) -> TensorHeader:
        return dataclasses.replace(good, **kw)

    cases = [
        (h(dtype="complex64"), data, {}, "unknown tensor dtype"),
        (h(shape=(2, -3)), data, {}, "negative"),
        (h(shape=(1,) * 9, nbytes=4), data[:4], {}, "dimensions"),
        (h(shape=(1 << 20, 1 << 20)), data, {}, "limit"),
        (good, data, {"max_bytes": 16}, "limit"),
        (h(nbytes=20), data, {}, "header says 20 bytes"),
        (good, data[:-1], {}, "payload has 23 bytes"),
        (good, data + b"\0", {}, "payload has 25 bytes"),
        (good, data, {"expect_shape": (3, 2)}, r"expected \(3, 2\)"),
        (good, data, {"expect_shape": (2, 3, 1)}, "expected"),
        (good, data, {"expect_dtype": "bfloat16"}, "expected bfloat16"),
        (good, data, {"expect_dtype": torch.int64}, "expected int64"),
    ]
    for header, buf, kw, message in cases:
        with pytest.raises(TensorError, match=message):
            unpack(header, buf, **kw)
    assert unpack(good, data, expect_shape=(None, 3)).shape == (2, 3)
    for bad in (math.nan, math.inf, -math.inf):
        header, payload = pack(torch.tensor([1.0, bad]))
        with pytest.raises(TensorError, match="NaN/Inf"):
            unpack(header, payload)
        assert unpack(header, payload, allow_nonfinite=True).shape == (2,)
    header, payload = pack(torch.tensor([True, False]))
    with pytest.raises(TensorError, match="0 and 1"):
        unpack(header, b"\x01\x07")
    with pytest.raises(TensorError, match="cannot travel"):
        pack(torch.zeros(2, dtype=torch.complex64))


# ---- data ---------------------------------------------------------------------------------


def test_byte_tokenizer_and_bundled_corpus() -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("héllo")) == "héllo" and max(tok.encode("ÿ")) < 256
    text = bundled_text()
    assert len(text) > 400_000 and text == bundled_text()
    assert "assert" in text


def test_microbatches_are_deterministic_and_shards_disjoint() -> None:
    m = tiny(seq_len=16, microbatch_size=4)
    tok = ByteTokenizer()
    tokens = encode_corpus(m.data, tok)
    a = MicrobatchSource(m.data, tok, 0, 2, seed=0, tokens=tokens)
    b = MicrobatchSource(m.data, tok, 1, 2, seed=0, tokens=tokens)
    x, y = a.get(5)
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert torch.equal(MicrobatchSource(m.data, tok, 0, 2, seed=0, tokens=tokens).get(5)[0], x)
    assert not torch.equal(a.get(6)[0], x)
    assert not torch.equal(MicrobatchSource(m.data, tok, 0, 2, seed=1, tokens=tokens).get(5)[0], x)
    # the windows a data node reads lie inside its own shard of the token stream
    for src in (a, b):
        for seq in (0, 7, src.microbatches_per_epoch + 3):
            starts = src.window_starts(seq) + src.shard_start
            assert (starts >= src.shard_start).all()
            assert (starts + 17 <= src.shard_start + src.shard.numel()).all()
            x, _ = src.get(seq)
            for row, s in zip(x, starts.tolist()):
                assert torch.equal(row, tokens[s : s + 16])
    assert a.shard_start + a.shard.numel() == b.shard_start
    # one epoch visits each window at most once
    starts = torch.cat([a.window_starts(s) for s in range(a.microbatches_per_epoch)])
    assert starts.unique().numel() == starts.numel()
    next_epoch = torch.cat([a.window_starts(s + a.microbatches_per_epoch) for s in range(3)])
    assert not torch.equal(next_epoch, starts[: next_epoch.numel()])


def test_user_files(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("the quick brown fox " * 20)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "jumps over " * 10}) + "\n\n" + json.dumps({"text": "the dog"}) + "\n")
    m = with_data(tiny(), source=["a.txt", "b.jsonl"], seq_len=8, microbatch_size=2)
    m = dataclasses.replace(m, base_dir=str(tmp_path))
    src = MicrobatchSource.for_manifest(m, 0, 1)
    text = ByteTokenizer().decode(src.shard.tolist())
    assert text.startswith("the quick") and "jumps over" in text and text.endswith("the dog")
    x, y = src.get(0)
    assert x.shape == (2, 8)

    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"title": 1}\n')
    (tmp_path / "notjson.jsonl").write_text("hello\n")
    (tmp_path / "short.txt").write_text("tiny")
    for files, message in [
        (["missing.txt"], "not found"),
        (["empty.txt"], "empty"),
        (["bad.jsonl"], 'line 2 has no string field "text"'),
        (["notjson.jsonl"], "line 1 is not JSON"),
        (["short.txt"], "too short"),
    ]:
        with pytest.raises(ManifestError, match=message):
            MicrobatchSource.for_manifest(with_data(m, source=files), 0, 1)
    with pytest.raises(ManifestError, match="tokenizer file"):
        MicrobatchSource.for_manifest(with_data(m, tokenizer="tok.json"), 0, 1)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_weights_from_a_local_file(suffix: str, tmp_path) -> None:
    m = tiny("gpt")
    full = build_full_model(m)
    with torch.no_grad():
        for p in full.parameters():
            p.add_(0.5)
    path = tmp_path / f"w{suffix}"
    if suffix == ".pt":
        torch.save(full.state_dict(), path)
    else:
        from safetensors.torch import save_model

        save_model(full, str(path))  # stores the tied lm_head / wte once
    loaded = dataclasses.replace(m, model=dataclasses.replace(m.model, weights=path.name), base_dir=str(tmp_path))
    data = build_stage(loaded, "data")
    expect = torch.cat([dict(full.named_parameters())[n].detach().reshape(-1) for n in data.names])
    assert torch.equal(data.param_vector(), expect)
    assert data.module.lm_head.weight is data.module.embed_tokens.weight
    torch.save({"nonsense.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    bad = dataclasses.replace(loaded, model=dataclasses.replace(m.model, weights="bad.pt"))
    with pytest.raises(ManifestError, match="do not match model.config"):
        build_stage(bad, "relay", 0)


def test_a_buffer_file_reads_a_state_without_copying_it():
    """`BufferFile` is a seekable file over a bytearray or memoryview: `torch.load` reads a state through it as
    through `io.BytesIO`, and its reads, seeks and end of file behave as a file's."""
    import io

    from gwtf_node.model.tensors import BufferFile

    state = {"names": ["w"], "params": [torch.arange(1000, dtype=torch.float32)]}
    buf = io.BytesIO()
    torch.save(state, buf)
    raw = bytearray(buf.getvalue())
    got = torch.load(BufferFile(memoryview(raw)), map_location="cpu", weights_only=True)
    assert got["names"] == ["w"] and torch.equal(got["params"][0], state["params"][0])
    f = BufferFile(b"abcdef")
    assert f.read(2) == b"ab" and f.tell() == 2
    assert f.seek(-1, io.SEEK_END) == 5 and f.read() == b"f" and f.read(3) == b""
    assert f.seek(1) == 1 and f.seek(2, io.SEEK_CUR) == 3 and f.read(10) == b"def"
