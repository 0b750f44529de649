#!/usr/bin/env python3
"""Memory and build time of each node's part, building the whole model and cutting it against building the part alone.

    python scripts/bench_stage_init.py                  # this checkout against `main`
    python scripts/bench_stage_init.py --before REV     # against another git revision
    python scripts/bench_stage_init.py --json           # one JSON object

The model is the ~127M LLaMA-family shape (hidden 576, 28 layers, 9 heads / 3
key-value heads, vocabulary 49,152, tied embeddings, SwiGLU width 1536) cut into
4 stages of 7 layers.  For each node of the run (the data node and relays 0..3),
and for each code version (`before`: the revision's `gwtf_node` exported with
`git archive` into a temporary directory; `after`: this checkout), a fresh
Python process imports torch and transformers, notes its peak resident memory
(VmHWM), builds the part with `build_stage`, runs one microbatch (1 x 32 tokens)
forward and backward through it, and notes the peak again.  Reported per node:
the growth of the peak over the import-only process (MB), the build time (s),
and the ratios after/before; and the same for the centralized reference's
`build_chain` (every part in one process, no microbatch: row `chain`); and the fp32 training state of the whole model
(16 bytes per parameter: parameters, gradients, Adam's two moments) that a
relay's growth is compared with.  The two versions run one after the other in
this one script, node by node, so their ratio is measured side by side; on a
shared machine the absolute times move with the others' load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, sys, time
import torch, transformers  # the baseline: a process that imported torch and transformers
torch.set_num_threads(1)

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

from gwtf_node.model.manifest import RunManifest
from gwtf_node.model.stages import build_stage
m = RunManifest.from_json(sys.argv[1])
role, stage = sys.argv[2], (None if sys.argv[3] == "-" else int(sys.argv[3]))
import transformers.models.llama.modeling_llama, transformers.masking_utils  # both versions import them to build
base = peak()
t0 = time.perf_counter()
if role == "chain":  # the centralized reference: every part in one process
    from gwtf_node.model.reference import build_chain
    data, relays = build_chain(m)
    build_s = time.perf_counter() - t0
    import gwtf_node
    print(json.dumps({"src": gwtf_node.__file__, "base": base, "built": peak(), "peak": peak(), "build_s": build_s,
                      "part_params": sum(p.num_params for p in (data, *relays))}))
    sys.exit(0)
part = build_stage(m, role, stage)
build_s = time.perf_counter() - t0
built = peak()
if role == "relay":
    x = torch.randn(part.expected_hidden_shape())
    out = part.forward("k", x)
    part.backward("k", torch.ones_like(out))
else:
    ids = torch.zeros(m.data.microbatch_size, m.data.seq_len, dtype=torch.long)
    h = part.embed("k", ids)
    _, g = part.head_loss("k", h, ids)
    part.embed_backward("k", g)
import gwtf_node
print(json.dumps({"src": gwtf_node.__file__, "base": base, "built": built, "peak": peak(), "build_s": build_s, "part_params": part.num_params}))
"""


def manifest_json() -> tuple[str, int]:
    sys.path.insert(0, str(ROOT))
    import dataclasses

    from gwtf_node.model.manifest import default_manifest

    m = default_manifest(family="llama", stages=4, layers=28, hidden=576, seq_len=32, microbatch_size=1,
                         microbatches_per_iteration=1)
    config = {**m.model.config, "vocab_size": 49152, "intermediate_size": 1536, "num_attention_heads": 9,
              "num_key_value_heads": 3, "tie_word_embeddings": True, "max_position_embeddings": 2048}
    m = dataclasses.replace(m, model=dataclasses.replace(m.model, config=config))
    h, v, f, L = 576, 49152, 1536, 28
    kv = h // 9 * 3
    params = v * h + L * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h
    return m.to_json(indent=None), params


def probe(src: Path, run_json: str, role: str, stage: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE, run_json, role, "-" if stage is None else str(stage)],
                          capture_output=True, text=True, env=env, timeout=900, cwd=src)
    if proc.returncode != 0:
        raise SystemExit(f"probe of {role} {stage} with {src} failed:\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(r["src"]).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"the probe imported {r['src']}, not the code under {src}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default="main", help="git revision to compare with (default: main)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    run_json, params = manifest_json()
    nodes = [("data", None)] + [("relay", k) for k in range(4)] + [("chain", None)]
    out = {"params": params, "training_state_mb": 16 * params / 1e6, "before": args.before, "nodes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "gwtf_node"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        for role, stage in nodes:
            name = role if stage is None else f"relay{stage}"
            row = {}
            for version, src in (("before", Path(tmp)), ("after", ROOT)):
                r = probe(src, run_json, role, stage)
                row[version] = {"peak_growth_mb": (r["peak"] - r["base"]) / 1e6, "build_s": r["build_s"],
                                "part_params": r["part_params"]}
            row["memory_ratio"] = row["after"]["peak_growth_mb"] / row["before"]["peak_growth_mb"]
            row["build_time_ratio"] = row["after"]["build_s"] / row["before"]["build_s"]
            row["growth_over_training_state"] = row["after"]["peak_growth_mb"] / out["training_state_mb"]
            out["nodes"][name] = row
            if not args.json:
                b, a = row["before"], row["after"]
                print(f"{name:7s} params {a['part_params'] / 1e6:6.1f}M | peak growth MB before {b['peak_growth_mb']:7.0f}"
                      f" after {a['peak_growth_mb']:6.0f} (x{row['memory_ratio']:.2f}, "
                      f"{row['growth_over_training_state']:.2f} of the model's training state) | build s before "
                      f"{b['build_s']:6.2f} after {a['build_s']:5.2f} (x{row['build_time_ratio']:.2f})", flush=True)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"model: {params / 1e6:.1f}M parameters, fp32 training state {out['training_state_mb']:.0f} MB")


if __name__ == "__main__":
    main()
