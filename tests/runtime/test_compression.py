"""Top-K on the tensor channel: encode/decode, the wire form and its refusals, Equation 7, the manifest field."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gwtf_node import cli
from gwtf_node.model.adatopk import (
    Compression, Gradients, adaptive_ratio, kept_count, link_ratio, sparse_overhead, transfer_s,
)
from gwtf_node.model.compression import SparseError, gather, topk_decode, topk_encode
from gwtf_node.model.manifest import ManifestError, RunManifest, default_manifest
from gwtf_node.model.crossings import Crossings
from gwtf_node.model.tensors import TensorError, pack, pack_at, pack_topk, sparse_indices, unpack
from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.node.linkcompress import LinkCompression
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place

# ---- encode / decode ---------------------------------------------------------------------


@given(n=st.integers(1, 400), frac=st.floats(0.001, 1.0), seed=st.integers(0, 2**16))
def test_round_trip_keeps_values_exactly_and_bounds_the_error(n: int, frac: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g) * torch.rand(n, generator=g) * 10
    k = max(1, min(n, round(frac * n)))
    idx, vals = topk_encode(t, k)
    assert idx.dtype == torch.int32 and idx.numel() == k == vals.numel()
    assert bool((idx[1:] > idx[:-1]).all())  # ascending, distinct
    out = topk_decode(idx, vals, (n,))
    kept = torch.zeros(n, dtype=torch.bool)
    kept[idx.long()] = True
    assert torch.equal(out[kept], t[kept])  # kept values come back bit for bit
    assert bool((out[~kept] == 0).all())
    # the dropped elements are the smallest in magnitude ...
    if k < n:
        assert float(t[~kept].abs().max()) <= float(t[kept].abs().min())
    # ... so the error is exactly the dropped part, at most (1 - k/n) of the energy
    err = float((t - out).pow(2).sum())
    assert err == pytest.approx(float(t[~kept].pow(2).sum()), rel=1e-6, abs=1e-9)
    assert err <= (1 - k / n) * float(t.pow(2).sum()) * (1 + 1e-6) + 1e-9


def test_error_measured_on_an_activation_shape() -> None:
    """On a [B, T, H] activation the relative error at ratio 10 is well under the sqrt(0.9) bound."""
    t = torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(0))
    n = t.numel()
    k = kept_count(n, 10.0, 4)
    assert k == math.ceil(n / 10)
    idx, vals = topk_encode(t, k)
    out = topk_decode(idx, vals, tuple(t.shape))
    rel = float((t - out).norm() / t.norm())
    # Gaussian: the top 10 % of |x| hold about 42 % of the energy, so the relative error is about sqrt(0.58)
    assert 0.70 < rel < 0.80 <= math.sqrt(1 - k / n)


def test_decode_refuses_bad_indices() -> None:
    vals = torch.ones(3)
    with pytest.raises(SparseError, match="out of range"):
        topk_decode(torch.tensor([0, 2, 9], dtype=torch.int32), vals, (3, 3))
    with pytest.raises(SparseError, match="out of range"):
        topk_decode(torch.tensor([-1, 2, 5], dtype=torch.int32), vals, (3, 3))
    with pytest.raises(SparseError, match="strictly increasing"):
        topk_decode(torch.tensor([1, 1, 5], dtype=torch.int32), vals, (3, 3))
    with pytest.raises(SparseError, match="strictly increasing"):
        topk_decode(torch.tensor([4, 1, 5], dtype=torch.int32), vals, (3, 3))
    with pytest.raises(SparseError, match="2 indices but 3 values"):
        topk_decode(torch.tensor([1, 5], dtype=torch.int32), vals, (3, 3))
    with pytest.raises(SparseError, match="floating-point"):
        topk_encode(torch.arange(4), 2)
    with pytest.raises(SparseError, match="cannot keep 5 of 4"):
        topk_encode(torch.ones(4), 5)


# ---- the wire form ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [1, 5, 23])
def test_pack_topk_unpack(dtype: torch.dtype, k: int) -> None:
    t = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(k)).to(dtype)
    header, payload = pack_topk(t, k)
    assert header.sparse_kept == k and header.shape == (2, 3, 4) and header.dtype == pack(t)[0].dtype
    assert header.nbytes == payload.nbytes == k * (4 + t.element_size())
    idx, vals = topk_encode(t, k)
    out = unpack(header, bytes(payload), expect_shape=(2, 3, 4), expect_dtype=dtype)
    assert torch.equal(out, topk_decode(idx, vals, (2, 3, 4)))
    # the header goes through the codec like any other
    fwd = m.Forward("d", 1, 0, ("d",), header)
    assert codec.decode(codec.encode("me", fwd))[1] == fwd


def test_unpack_refuses_malformed_sparse_payloads() -> None:
    t = torch.arange(1.0, 13.0).reshape(3, 4)
    good, payload = pack_topk(t, 3)  # indices 9, 10, 11 (values 10, 11, 12)
    data = bytes(payload)
    idx = lambda *xs: torch.tensor(xs, dtype=torch.int32).numpy().tobytes()  # noqa: E731
    vals = torch.tensor([10.0, 11.0, 12.0]).numpy().tobytes()

    def h(**kw) -> m.TensorHeader:
        return dataclasses.replace(good, **kw)

    cases = [
        (good, idx(9, 10, 12) + vals, {}, "out of range"),
        (good, idx(-1, 10, 11) + vals, {}, "out of range"),
        (good, idx(9, 9, 11) + vals, {}, "strictly increasing"),
        (good, idx(11, 10, 9) + vals, {}, "strictly increasing"),
        (good, data[:-4], {}, "payload has 20 bytes"),  # one value short
        (h(sparse_kept=4), data, {}, "4 Top-K elements of float32 need 32"),  # wrong count
        (h(sparse_kept=13, nbytes=13 * 8), data, {}, "keeps 13 elements"),
        (h(sparse_kept=2**63), data, {}, "keeps"),
        (h(dtype="int32"), data, {}, "must be floating point"),
        (good, idx(9, 10, 11) + torch.tensor([1.0, math.nan, 2.0]).numpy().tobytes(), {}, "NaN/Inf"),
        (good, data, {"expect_shape": (4, 3)}, "expected"),
        (good, data, {"expect_dtype": "float16"}, "expected float16"),
    ]
    for header, buf, kw, message in cases:
        with pytest.raises(TensorError, match=message):
            unpack(header, buf, **kw)
    assert torch.equal(unpack(good, data), torch.where(t > 9, t, torch.zeros(())))


# ---- Equation 7 -----------------------------------------------------------------------------


def test_equation_7_on_hand_checked_links() -> None:
    # the paper's overhead (float32 values, int64 indices): 3; ratio r = 100
    assert sparse_overhead(4, 8) == 3.0
    slowest = transfer_s(1e6, 8)  # 1 MB at 8 Mbit/s: 1 s
    assert slowest == pytest.approx(1.0)
    assert adaptive_ratio(slowest, slowest, 100, 3.0) == pytest.approx(300)  # the slowest link: 3r
    assert adaptive_ratio(transfer_s(1e6, 80), slowest, 100, 3.0) == pytest.approx(30)  # 10x faster: 3r/10
    assert adaptive_ratio(transfer_s(1e6, 2400), slowest, 100, 3.0) == pytest.approx(1.0)  # 300x faster: 1
    assert adaptive_ratio(transfer_s(1e6, 10_000), slowest, 100, 3.0) == 1.0  # faster still: max(1, .)
    # here: int32 indices, so c = 2 for float32 (and 1.5 for float64, 3 for bfloat16)
    assert sparse_overhead(4) == 2.0 and sparse_overhead(8) == 1.5 and sparse_overhead(2) == 3.0
    # geo12: Australia-Belgium 84.41 Mbit/s (the slowest link), Canada-Iowa 650.12; r = 10
    aus_bel, can_iowa = transfer_s(1, 84.41), transfer_s(1, 650.12)
    assert link_ratio(Compression.ADATOPK, 10, aus_bel, aus_bel, 2.0) == pytest.approx(20)
    assert link_ratio(Compression.ADATOPK, 10, can_iowa, aus_bel, 2.0) == pytest.approx(20 * 84.41 / 650.12)
    assert link_ratio(Compression.TOPK, 10, can_iowa, aus_bel, 2.0) == 10
    assert link_ratio(Compression.NONE, 10, aus_bel, aus_bel, 2.0) == 1.0


def test_kept_count_sends_dense_when_sparse_is_not_smaller() -> None:
    assert kept_count(1000, 10, 4) == 100
    assert kept_count(1001, 10, 4) == 101
    assert kept_count(1000, 2.6, 4) == 385  # 385 * 8 bytes < 4000
    assert kept_count(1000, 2.0, 4) is None  # 500 * 8 bytes == 4000: dense
    assert kept_count(1000, 1.0, 4) is None
    assert kept_count(1000, 2.5, 8) == 400  # float64: 400 * 12 < 8000
    assert kept_count(0, 10, 4) is None
    assert kept_count(3, 1e9, 4) == 1


def _peers(me: str, name: str, stage: int | None, role: str, others: list[tuple[str, str, int]]) -> Peers:
    p = Peers(me=me, name=name, n_stages=2, place=Place(role=role, stage=stage, capacity=4))
    for pid, nm, st_ in others:
        p.peers[pid] = PeerInfo(pid, role="data" if st_ == -1 else "relay", stage=st_, name=nm)
    return p


def test_link_compression_picks_equation_7_ratios_from_the_links_table() -> None:
    """1 data node, 2 stages x 2 relays on geo12 (round-robin: d0 Australia, r0_0 Belgium, r0_1 Canada,
    r1_0 Germany, r1_1 Iowa); r = 10, float32 (c = 2)."""
    bw = {("d0", "r0_0"): 84.41, ("d0", "r0_1"): 113.25, ("r0_0", "r1_0"): 2083.06, ("r0_0", "r1_1"): 243.27,
          ("r0_1", "r1_0"): 273.68, ("r0_1", "r1_1"): 650.12, ("r1_0", "d0"): 89.86, ("r1_1", "d0"): 96.47,
          ("r0_0", "r0_1"): 170.92, ("d0", "r1_0"): 89.86}  # (same-stage and non-adjacent links do not count)
    bw.update({(b, a): v for (a, b), v in list(bw.items())})
    bw[("r0_0", "r0_1")] = bw[("r0_1", "r0_0")] = 1.0  # not a pipeline link: ignored although the slowest
    links = {k: (50.0, v) for k, v in bw.items()}
    nodes = [("D", "d0", -1), ("A", "r0_0", 0), ("B", "r0_1", 0), ("C", "r1_0", 1), ("E", "r1_1", 1)]
    man = default_manifest(compression="adatopk", compression_ratio=10)
    peers = _peers("B", "r0_1", 0, "relay", [n for n in nodes if n[0] != "B"])
    lc = LinkCompression(man, peers, links)
    assert lc.slowest_bandwidth() == 84.41
    assert lc.link_ratio("D") == pytest.approx(20 * 84.41 / 113.25)  # gradient back to the data node
    assert lc.link_ratio("E") == pytest.approx(20 * 84.41 / 650.12)  # 2.6: sparse, just
    assert lc.link_ratio("C") == pytest.approx(20 * 84.41 / 273.68)
    act = torch.zeros(8, 128, 256)
    assert lc.kept(peer="E", tensor=act) == math.ceil(act.numel() / (20 * 84.41 / 650.12))
    fast = LinkCompression(man, _peers("A", "r0_0", 0, "relay", [n for n in nodes if n[0] != "A"]), links)
    assert fast.link_ratio("C") == 1.0 and fast.kept("C", act) is None  # 2083 Mbit/s: dense
    uniform = LinkCompression(default_manifest(compression="topk", compression_ratio=10), peers, links)
    assert uniform.link_ratio("C") == uniform.link_ratio("E") == 10.0
    off = LinkCompression(default_manifest(), peers, links)
    assert not off.enabled and off.kept("C", act) is None
    assert off.kept("C", torch.zeros(4, dtype=torch.int64)) is None


# ---- the gradient at the activation's indices ------------------------------------------------------


def test_pack_at_sends_a_gradient_at_its_activations_indices() -> None:
    g = torch.Generator().manual_seed(3)
    act = torch.randn(2, 8, 16, generator=g)
    header, payload = pack_topk(act, 32)
    idx = sparse_indices(header, payload)
    assert idx is not None and idx.dtype == torch.int32 and idx.numel() == 32
    assert sparse_indices(*pack(act)) is None
    grad = torch.randn(2, 8, 16, generator=g)
    h2, p2 = pack_at(grad, idx)
    assert h2.sparse_kept == 32 and h2.nbytes == header.nbytes  # the same bytes as the activation's Top-K
    back = unpack(h2, p2)
    mask = torch.zeros(act.numel(), dtype=torch.bool)
    mask[idx.long()] = True
    assert torch.equal(back.reshape(-1)[mask], grad.reshape(-1)[mask])  # kept exactly
    assert not back.reshape(-1)[~mask].any()  # zero where the activation was dropped
    assert torch.equal(sparse_indices(h2, p2), idx)
    with pytest.raises(SparseError, match="not strictly increasing"):
        gather(grad, idx.flip(0))
    with pytest.raises(SparseError, match="out of range"):
        gather(grad[:1], idx)


def test_aligned_gradient_is_the_exact_gradient_of_the_sparsified_pass() -> None:
    """Autograd through a Top-K mask gives the gradient at the kept elements only: what `aligned` sends."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, generator=g, requires_grad=True)
    w = torch.randn(6, 3, generator=g)
    cross = Crossings([3.0], [3.0])
    sparse, kept = cross.forward_at(0, x.detach())
    mask = torch.zeros(x.numel())
    mask[kept.long()] = 1
    ((x * mask.reshape(x.shape)) @ w).square().sum().backward()  # the pass the receiver computes, as a function of x
    upstream = 2 * (sparse @ w) @ w.T  # the receiver's gradient of its dense rebuild
    assert torch.allclose(cross.backward_at(0, upstream, kept), x.grad)
    paper = Crossings([3.0], [3.0], Gradients.TOPK)
    assert not torch.allclose(paper.backward_at(0, upstream, kept), x.grad)


# ---- the manifest and init-run ------------------------------------------------------------------


def test_manifest_carries_the_compression() -> None:
    plain = default_manifest()
    assert plain.train.compression == "none"
    assert "compression" not in json.loads(plain.to_json())["train"]  # absent: run ids of existing runs hold
    ada = default_manifest(compression="adatopk", compression_ratio=8)
    d = json.loads(ada.to_json())["train"]
    assert d["compression"] == "adatopk" and d["compression_ratio"] == 8
    back = RunManifest.from_json(ada.to_json())
    assert back.train.compression == "adatopk" and back.train.compression_ratio == 8
    assert back.run_id == ada.run_id != plain.run_id
    topk = default_manifest(compression="topk")
    assert json.loads(topk.to_json())["train"]["compression_ratio"] == 10.0  # explicit whenever compressing
    assert "compression_gradients" not in json.loads(topk.to_json())["train"]  # aligned, the default: absent
    paper = default_manifest(compression="topk", compression_gradients="topk")
    assert json.loads(paper.to_json())["train"]["compression_gradients"] == "topk"
    assert RunManifest.from_json(paper.to_json()).train.compression_gradients == "topk"
    assert paper.run_id != topk.run_id


@pytest.mark.parametrize("field, value, message", [
    ("compression", "gzip", "train.compression is 'gzip'; use one of none, topk, adatopk"),
    ("compression", 3, "train.compression is 3"),
    ("compression_ratio", 1, "train.compression_ratio is 1; it must be a finite number > 1"),
    ("compression_ratio", "10", "train.compression_ratio is '10'"),
    ("compression_ratio", 0.5, "train.compression_ratio"),
    ("compression_gradients", "dense", "train.compression_gradients is 'dense'; use one of aligned, topk"),
])
def test_manifest_refuses_bad_compression(field: str, value, message: str) -> None:
    d = json.loads(default_manifest(compression="topk").to_json())
    d["train"][field] = value
    with pytest.raises(ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunManifest.from_json(json.dumps(d))
    d["train"]["compression_ratio"] = float("inf") if field == "compression_ratio" else 10
    if field == "compression_ratio":
        with pytest.raises(ManifestError, match="train.compression_ratio"):
            RunManifest.from_json(json.dumps(d).replace("Infinity", "1e999"))


def test_init_run_flags(tmp_path, capsys) -> None:
    out = tmp_path / "run.json"
    assert cli.main(["init-run", "--out", str(out), "--compression", "adatopk", "--compression-ratio", "20"]) == 0
    train = json.loads(out.read_text())["train"]
    assert train["compression"] == "adatopk" and train["compression_ratio"] == 20
    assert cli.main(["init-run", "--out", str(out)]) == 0
    assert "compression" not in json.loads(out.read_text())["train"]
    assert cli.main(["init-run", "--out", str(out), "--compression", "topk", "--compression-gradients", "topk"]) == 0
    assert json.loads(out.read_text())["train"]["compression_gradients"] == "topk"
    assert cli.main(["init-run", "--out", str(out), "--compression", "topk", "--compression-ratio", "1"]) == 2
    assert "train.compression_ratio is 1.0" in capsys.readouterr().err
