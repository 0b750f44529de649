#!/usr/bin/env python3
"""Profile the Table II model's stages on this machine: the compute times of `sim train`.

    python scripts/profile_stages.py                 # measure, print, write gwtf_node/data/stage_profile.json
    python scripts/profile_stages.py --no-write      # measure and print only

The model is the paper's Table II LLaMA-like (section VI, "Node Crashes"):
d_model 1024, 16 layers, microbatches of 4 x 512 tokens, a LLaMA vocabulary
of 32000 (the paper does not give one; LLaMA's), 16 heads (the paper's 18 do
not divide 1024), a SwiGLU width of 2752 (~8/3 d_model, LLaMA's rule).  Its
stages are those of the paper: a data node holds the embedding, one block,
the data and the loss (norm + LM head + cross-entropy); each of the 5 relay
stages 3 blocks.  Weights are random (the times do not depend on them) and
built with our own parts (`gwtf_node.model.stages.DataPart` / `RelayPart`),
so this is the code the daemon runs.

Measured, per microbatch (median of `--repeats` after one warm-up):

* relay_forward, relay_backward: one relay stage (3 blocks);
* data_forward: embedding + the data node's block;
* data_loss: norm + head + loss, forward and backward down to the hidden
  state (what the data node does when a microbatch reaches the sink);
* data_final: the data node block's backward and the embedding's.

This machine is not the paper's GPU, so the simulator keeps one absolute
anchor, the relay stage forward estimated from FLOPs on the paper's RTX A4000
(the docstring of gwtf_node/sim/train/: 0.35 s), and takes every other time as the measured
ratio to the relay forward.  The JSON file (`stage_profile.json`) is what
`gwtf_node.sim.train` reads; re-run this script to refresh it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "gwtf_node" / "data" / "stage_profile.json"

D_MODEL, LAYERS, HEADS, FFN, VOCAB = 1024, 16, 16, 2752, 32000
BATCH, SEQ = 4, 512
DATA_BLOCKS, RELAY_BLOCKS = 1, 3


def _median_s(fn, repeats: int) -> float:
    """Median time of `fn` after one warm-up; a `fn` that returns a number has timed its own part."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        own = fn()
        ts.append(own if own is not None else time.perf_counter() - t0)
    return statistics.median(ts)


def profile(repeats: int, threads: int | None) -> dict:
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    from gwtf_node.model.stages import DataPart, RelayPart

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=FFN, num_hidden_layers=DATA_BLOCKS
                      + RELAY_BLOCKS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                      max_position_embeddings=SEQ, tie_word_embeddings=False)
    full = LlamaForCausalLM(cfg).eval()
    data = DataPart("llama", full)
    first = RelayPart("llama", full, 0, DATA_BLOCKS)  # the data node's block
    relay = RelayPart("llama", full, DATA_BLOCKS, DATA_BLOCKS + RELAY_BLOCKS)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = torch.randint(0, VOCAB, (BATCH, SEQ))
    hidden = torch.randn(BATCH, SEQ, D_MODEL)
    grad = torch.randn(BATCH, SEQ, D_MODEL)
    out: dict[str, float] = {}

    def relay_forward():
        with torch.no_grad():
            relay(hidden)

    def relay_backward():  # forward with the graph (not timed), then the timed backward
        x = hidden.clone().requires_grad_(True)
        y = relay(x)
        t0 = time.perf_counter()
        torch.autograd.grad(y, [x] + list(relay.parameters()), grad)
        return time.perf_counter() - t0

    def data_forward():
        with torch.no_grad():
            first(data.embed(ids))

    def data_loss():
        x = hidden.clone().requires_grad_(True)
        logits = data.head(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        torch.autograd.grad(loss, [x] + list(data.norm.parameters()) + list(data.lm_head.parameters()))

    def data_final():
        h = data.embed(ids)
        y = first(h)
        t0 = time.perf_counter()
        torch.autograd.grad(y, list(first.parameters()) + list(data.embed_tokens.parameters()), grad)
        return time.perf_counter() - t0

    for name, fn in (("relay_forward", relay_forward), ("data_forward", data_forward), ("data_loss", data_loss),
                     ("relay_backward", relay_backward), ("data_final", data_final)):
        out[name] = _median_s(fn, repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    import torch

    t0 = time.time()
    s = profile(args.repeats, args.threads)
    ratios = {k: v / s["relay_forward"] for k, v in s.items()}
    print(f"model: LLaMA-like d={D_MODEL}, {LAYERS} layers, vocab {VOCAB}, microbatch {BATCH} x {SEQ}; "
          f"data node = embedding + {DATA_BLOCKS} block + loss, relay = {RELAY_BLOCKS} blocks")
    print(f"{'part':16s} {'seconds here':>12s} {'/ relay forward':>16s}")
    for k in ("relay_forward", "relay_backward", "data_forward", "data_loss", "data_final"):
        print(f"{k:16s} {s[k]:12.3f} {ratios[k]:16.3f}")
    print(f"({time.time() - t0:.0f} s; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()})")
    if not args.no_write:
        doc = {
            "format": "gwtf-stage-profile/1",
            "command": "python scripts/profile_stages.py",
            "model": {"family": "llama", "d_model": D_MODEL, "layers": LAYERS, "heads": HEADS, "ffn": FFN,
                      "vocab": VOCAB, "microbatch": [BATCH, SEQ], "data_blocks": DATA_BLOCKS,
                      "relay_blocks": RELAY_BLOCKS},
            "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(),
                        "cpu": platform.processor() or platform.machine()},
            "seconds": {k: round(v, 4) for k, v in s.items()},
            "ratio_to_relay_forward": {k: round(v, 4) for k, v in ratios.items()},
        }
        OUT.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
