#!/usr/bin/env python3
"""Plot loss curves from the JSON lines of `gwtf-node local --json` (and `--centralized --json`).

    gwtf-node local --iterations 50 --json > swarm.jsonl
    gwtf-node local --iterations 50 --json --centralized > central.jsonl
    python scripts/plot_loss.py swarm.jsonl:swarm central.jsonl:centralized --out docs/demo_loss.png

Each argument is FILE or FILE:LABEL.  The x axis is samples seen, so runs
with different batch sizes or lost microbatches compare at equal data.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read(path: Path) -> list[dict]:
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            sys.exit(f"error: {path}:{i}: not JSON ({e})")
    if not rows or any("loss" not in r or "samples" not in r for r in rows):
        sys.exit(f"error: {path}: expected JSON lines with 'loss' and 'samples' (gwtf-node local --json)")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="FILE[:LABEL]")
    p.add_argument("--out", default="loss.png")
    p.add_argument("--title", default="gwtf-node local: training loss")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for spec in args.runs:
        path, _, label = spec.partition(":")
        rows = read(Path(path))
        xs, total = [], 0
        for r in rows:
            total += r["samples"]
            xs.append(total)
        ax.plot(xs, [r["loss"] for r in rows], label=label or Path(path).stem,
                linestyle="--" if "central" in (label or path) else "-")
        print(f"{label or path}: {len(rows)} iterations, loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}")
    ax.set_xlabel("samples")
    ax.set_ylabel("loss (mean over the iteration's microbatches)")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
