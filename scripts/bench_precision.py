"""Precision on the wire and in the loss: bytes per token of fp32, bf16 and bf16 + AdaTopK, and the loss gap.

Bytes: one microbatch goes through the centralized chain (`model/reference.py`)
and each of its S + 1 crossings' tensors (the activation forward, its gradient
back) is packed as the tensor channel packs it (`model/tensors.py`): dense
float32, dense bfloat16, and bfloat16 Top-K at the ratio AdaTopK's Equation 7
gives each link (`model/adatopk.py`), with the gradients at their activation's
indices (`aligned`).  The links: the data node's (into stage 0, out of the last
stage) at `--slow-mbps`, the links between stages at `--fast-mbps`; the
slowest gets c * r with c = (2 + 4) / 2 for bfloat16 values and int32 indices,
a link fast enough to fall at or below c goes dense.  Bytes per token are the
payload bytes of one microbatch over its B * T tokens (the frame's header of
a few dozen bytes left out).

Loss: the centralized reference trains the same model from the same seed on
the same microbatches for `--iterations` iterations in each setting (fp32;
bf16-mixed compute with a bf16 wire; the same with AdaTopK at the crossings,
`model/crossings.py`), and the relative gap of each final loss (the mean of
the last 5 iterations' losses, to smooth microbatch noise) to fp32's is
printed, with each setting's time per iteration (this machine's CPU, shared:
a ratio side by side, not an absolute figure).

    python scripts/bench_precision.py [--iterations 30] [--hidden 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from gwtf_node.model.adatopk import Compression, Gradients, kept_count, link_ratio, sparse_overhead, transfer_s  # noqa: E402
from gwtf_node.model.crossings import Crossings  # noqa: E402
from gwtf_node.model.manifest import RunManifest, default_manifest  # noqa: E402
from gwtf_node.model.reference import build_chain, make_sources, train_centralized  # noqa: E402
from gwtf_node.model.tensors import pack, pack_at, pack_topk  # noqa: E402

TAIL = 5  # iterations averaged for the final loss


def with_precision(man: RunManifest, precision: str, wire: str) -> RunManifest:
    out = replace(man, train=replace(man.train, precision=precision, wire_dtype=wire))
    out.validate(check_files=False)
    return out


def link_ratios(stages: int, ratio: float, slow_mbps: float, fast_mbps: float, value_bytes: int) -> list[float]:
    """Equation 7's ratio of each crossing: 0 and S on the data node's links (slow), the others fast."""
    bws = [slow_mbps] + [fast_mbps] * (stages - 1) + [slow_mbps]
    slowest = min(bws)
    return [link_ratio(Compression.ADATOPK, ratio, transfer_s(1, bw), transfer_s(1, slowest),
                       sparse_overhead(value_bytes)) for bw in bws]


def crossing_tensors(man: RunManifest) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """The activation and the gradient of every crossing of one microbatch (dense, as the chain computes them),
    and its tokens."""
    data, relays = build_chain(man)
    x, y = make_sources(man, 1)[0].get(0)
    acts, grads = [], []
    h = data.embed(0, x)
    for r in relays:
        acts.append(h)
        h = r.forward(0, h)
    acts.append(h)
    _, g = data.head_loss(0, h, y)
    grads.append(g)
    for r in reversed(relays):
        g = r.backward(0, g)
        grads.append(g)
    return acts, grads[::-1], x.numel()


def wire_bytes_per_token(man: RunManifest, ratios: list[float]) -> dict[str, float]:
    acts, grads, tokens = crossing_tensors(man)
    out = {"fp32": 0, "bf16": 0, "bf16+adatopk": 0}
    for a, g, r in zip(acts, grads, ratios):
        for t in (a, g):
            out["fp32"] += pack(t.float())[0].nbytes
            out["bf16"] += pack(t.bfloat16())[0].nbytes
        ab, gb = a.bfloat16(), g.bfloat16()
        k = kept_count(ab.numel(), r, ab.element_size())
        if k is None:
            out["bf16+adatopk"] += pack(ab)[0].nbytes + pack(gb)[0].nbytes
        else:
            header, payload = pack_topk(ab, k)
            idx = torch.frombuffer(bytearray(payload[:4 * k]), dtype=torch.int32)
            out["bf16+adatopk"] += header.nbytes + pack_at(gb, idx)[0].nbytes
    return {name: b / tokens for name, b in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--ratio", type=float, default=10.0, help="the run's Top-K ratio r")
    p.add_argument("--slow-mbps", type=float, default=50.0, help="the data node's links")
    p.add_argument("--fast-mbps", type=float, default=1000.0, help="the links between stages")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = default_manifest(stages=args.stages, hidden=args.hidden, seq_len=args.seq_len, microbatch_size=4,
                            microbatches_per_iteration=4, seed=args.seed)
    ratios = link_ratios(args.stages, args.ratio, args.slow_mbps, args.fast_mbps, 2)
    bpt = wire_bytes_per_token(base, ratios)
    bf16 = with_precision(base, "bf16-mixed", "bf16")
    settings = [("fp32", base, None), ("bf16", bf16, None),
                ("bf16+adatopk", bf16, Crossings(ratios, ratios, Gradients.ALIGNED))]
    rows = []
    for name, man, crossings in settings:
        t0 = time.perf_counter()
        res = train_centralized(man, args.iterations, crossings=crossings)
        sec = (time.perf_counter() - t0) / args.iterations
        final = sum(res.losses[-TAIL:]) / len(res.losses[-TAIL:])
        rows.append({"setting": name, "wire_bytes_per_token": bpt[name], "final_loss": final,
                     "losses": res.losses, "s_per_iteration": sec})
    ref = rows[0]
    for r in rows:
        r["bytes_ratio"] = r["wire_bytes_per_token"] / ref["wire_bytes_per_token"]
        r["loss_gap"] = (r["final_loss"] - ref["final_loss"]) / ref["final_loss"]
        r["time_ratio"] = r["s_per_iteration"] / ref["s_per_iteration"]
    if args.json:
        for r in rows:
            print(json.dumps({"hidden": args.hidden, "stages": args.stages, "iterations": args.iterations,
                              "ratios": ratios, **r}))
        return 0
    print(f"llama hidden {args.hidden}, {args.stages} stages, seq {args.seq_len}, microbatch 4 x 4, "
          f"{args.iterations} iterations; AdaTopK ratios per crossing {[round(x, 2) for x in ratios]}")
    print(f"{'setting':14s} {'B/token':>9s} {'x fp32':>7s} {'final loss':>11s} {'gap':>8s} {'time x':>7s}")
    for r in rows:
        print(f"{r['setting']:14s} {r['wire_bytes_per_token']:9.1f} {r['bytes_ratio']:7.3f} {r['final_loss']:11.4f} "
              f"{100 * r['loss_gap']:+7.2f}% {r['time_ratio']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
