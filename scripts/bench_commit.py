"""A relay's commit: its held microbatches' weight gradients multiplied out one by one, or in chunks.

At BEGIN AGGREGATION a relay adds the gradients it holds (`StageModel.commit_many`):
each linear weight's as the product of its factors (model/linearfactors.py).
This script builds one relay stage of a model (`--preset`, e.g. llama-135m cut
into `--stages` stages), runs `--microbatches` forwards and backwards holding
them, and times, on the same held gradients, side by side:

* per key: each microbatch's products, in float32, added one after the other
  (what a relay did before `commit_many`);
* chunked: `commit_many`, a run of consecutive microbatches' factors
  concatenated into one product per chunk (`linearfactors.add_all`).

It prints both times, their ratio, and the relative difference of the two sums
(the chunks round once per chunk in the compute dtype; float32 differs by
summation order only).  `--threads` sets torch's threads (1: what one of the
nine nodes on this 2-core machine gets).

    python scripts/bench_commit.py [--preset llama-135m] [--precision bf16-mixed] [--microbatches 64] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from gwtf_node.model.hfconfig import family_config  # noqa: E402
from gwtf_node.model.linearfactors import materialized  # noqa: E402
from gwtf_node.model.manifest import default_manifest  # noqa: E402
from gwtf_node.model.presets import PRESETS, preset_config  # noqa: E402
from gwtf_node.model.stages import build_stage  # noqa: E402


def held_stage(args: argparse.Namespace):
    """The relay part of `--stage`, holding `--microbatches` microbatches' gradients."""
    family, config, _ = family_config(preset_config(args.preset))
    man = default_manifest(family=family, config=config, stages=args.stages, seq_len=args.seq_len,
                           microbatch_size=args.microbatch_size)
    wire = "bf16" if args.precision == "bf16-mixed" else "fp32"
    man = dataclasses.replace(man, train=dataclasses.replace(man.train, precision=args.precision, wire_dtype=wire))
    part = build_stage(man, "relay", args.stage)
    gen = torch.Generator().manual_seed(0)
    shape = part.expected_hidden_shape(args.microbatch_size)
    for k in range(args.microbatches):
        part.forward(k, torch.randn(shape, generator=gen).to(part.wire_dtype))
        part.backward(k, torch.randn(shape, generator=gen).to(part.wire_dtype), hold=True)
    return part


def timed_sum(part, held: dict, chunked: bool) -> tuple[float, torch.Tensor]:
    """Seconds to add `held` (restored into the part first) and the gradient vector it leaves."""
    for a in part._acc:
        a.zero_()
    part._held = dict(held)
    keys = list(held)
    t0 = time.perf_counter()
    if chunked:
        part.commit_many(keys)
    else:  # one microbatch after the other, each product in float32, then added (what a relay did before)
        for k in keys:
            for acc, g in zip(part._acc, part._held.pop(k)):
                if g is not None:
                    acc.add_(materialized(g))
    return time.perf_counter() - t0, torch.cat([a.reshape(-1) for a in part._acc])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="llama-135m", choices=[k for k, v in PRESETS.items() if v is not None])
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--stage", type=int, default=1)
    p.add_argument("--precision", default="bf16-mixed", choices=["fp32", "bf16-mixed"])
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--microbatch-size", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="best of this many timings of each")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.microbatches < 1 or args.repeats < 1 or args.threads < 1:
        raise SystemExit("bench_commit: --microbatches, --repeats and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    part = held_stage(args)
    held = dict(part._held)
    per_key = min(timed_sum(part, held, False)[0] for _ in range(args.repeats))
    chunked = min(timed_sum(part, held, True)[0] for _ in range(args.repeats))
    _, a = timed_sum(part, held, False)
    _, b = timed_sum(part, held, True)
    out = {"preset": args.preset, "stage": args.stage, "stage_params": sum(q.numel() for q in part.params),
           "precision": args.precision, "microbatches": args.microbatches,
           "tokens_per_microbatch": args.seq_len * args.microbatch_size, "threads": args.threads,
           "per_key_s": round(per_key, 3), "chunked_s": round(chunked, 3), "speedup": round(per_key / chunked, 2),
           "relative_difference": float((a - b).norm() / a.norm())}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.preset} stage {args.stage} of {args.stages} ({out['stage_params'] / 1e6:.1f}M parameters), "
          f"{args.precision}, {args.microbatches} microbatches of {out['tokens_per_microbatch']} tokens, "
          f"{args.threads} thread(s)")
    print(f"per key {per_key:.3f} s, chunked {chunked:.3f} s: {per_key / chunked:.2f}x; "
          f"sums differ by {out['relative_difference']:.2e} (relative)")


if __name__ == "__main__":
    main()
