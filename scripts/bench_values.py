#!/usr/bin/env python
"""The cost of the value check on an activation frame: receiving it with and without the magnitude scan.

Every frame that carries a float tensor is scanned for its largest finite
magnitude before its route runs (runtime/trust/values.py `Values.problem`, the
bound of protocol/bounds.py `check_magnitude`).  This measures, per
activation of a few shapes (the default manifest's, GPT-2 small's and a
larger one), the receiving path without the scan (`codec.decode` of the
envelope and `tensors.unpack` of the payload, with its shape, dtype and
finiteness checks) and the scan itself, done two ways: the one the daemon
runs (`values._max_abs`: one `torch.aminmax` pass over the frame's bytes, no
copy) and the earlier NumPy one (absolute value, finite mask, masked max),
kept here for comparison.  It prints the median of `--repeat` timings and
the ratio (receiving path + scan) / (receiving path).

    python scripts/bench_values.py [--repeat N] [--dtype float32|bfloat16|float16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from gwtf_node.model.tensors import pack, unpack  # noqa: E402
from gwtf_node.protocol import bounds, codec  # noqa: E402
from gwtf_node.protocol import messages as m  # noqa: E402
from gwtf_node.runtime.trust.values import _max_abs  # noqa: E402

SHAPES = ((2, 16, 64), (8, 512, 768), (4, 1024, 4096))  # default manifest, GPT-2 small, a 7B model's width
_NP = {"float32": "<f4", "float16": "<f2"}


def numpy_max_abs(dtype: str, payload) -> float:
    """The earlier scan: NumPy, with a temporary per step (kept for the comparison)."""
    if dtype == "bfloat16":
        arr = (np.frombuffer(payload, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        arr = np.frombuffer(payload, dtype=_NP[dtype])
    with np.errstate(invalid="ignore", over="ignore"):
        mag = np.abs(arr)
        finite = mag[np.isfinite(mag)]
    return float(finite.max()) if finite.size else 0.0


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # a daemon's receiving task shares the machine with its compute
    dt = getattr(torch, args.dtype)
    print(f"dtype {args.dtype}, median of {args.repeat}, one thread")
    print(f"{'activation shape':>18} {'MB':>7} {'receive ms':>11} {'torch scan ms':>14} {'ratio':>6} "
          f"{'numpy scan ms':>14} {'ratio':>6}")
    for shape in SHAPES:
        t = torch.randn(shape).to(dt)
        header, payload = pack(t)
        payload = bytes(payload)  # as a frame arrives: read-only bytes
        envelope = codec.encode("peer", m.Forward("d0", 1, 0, ("d0",), header))

        def receive() -> None:
            _, msg = codec.decode(envelope)
            unpack(msg.tensor, payload, expect_shape=shape, expect_dtype=args.dtype)

        def torch_scan() -> None:
            bounds.check_magnitude(_max_abs(args.dtype, payload), "Forward")

        def numpy_scan() -> None:
            bounds.check_magnitude(numpy_max_abs(args.dtype, payload), "Forward")

        assert _max_abs(args.dtype, payload) == numpy_max_abs(args.dtype, payload)
        base, fast, slow = (median_s(f, args.repeat) for f in (receive, torch_scan, numpy_scan))
        print(f"{str(shape):>18} {len(payload) / 1e6:7.2f} {base * 1e3:11.3f} {fast * 1e3:14.3f} "
              f"{(base + fast) / base:6.2f} {slow * 1e3:14.3f} {(base + slow) / base:6.2f}")


if __name__ == "__main__":
    main()
