"""Cutting a model's layers into pipeline stages, and the error every manifest check raises.

`partition_layers` cuts layers 0..n into contiguous stages, evenly or by
per-layer cost weights (the bottleneck stage as cheap as it can be).  It
lives beside `ManifestError` and the number checks the manifest shares, so
that manifest.py imports them from here without a cycle.
"""

from __future__ import annotations

import math
from typing import Any, Sequence


class ManifestError(ValueError):
    """A manifest that cannot be used; the message says what to fix."""


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def partition_layers(
    n_layers: int, n_stages: int, weights: Sequence[float] | None = None
) -> list[tuple[int, int]]:
    """Cut layers 0..n_layers into n_stages contiguous non-empty [start, end) ranges.

    Without weights the sizes differ by at most one, the larger stages first.
    With per-layer cost weights, the cut minimizes the most expensive stage
    (the pipeline's bottleneck); ties go to the earliest cut, so the result is
    a pure function of its arguments.
    """
    if not is_int(n_layers) or n_layers <= 0:
        raise ManifestError(f"cannot partition {n_layers!r} layers: give a positive number")
    if not is_int(n_stages) or n_stages <= 0:
        raise ManifestError(f"cannot cut the model into {n_stages!r} stages: give at least 1")
    if n_stages > n_layers:
        raise ManifestError(f"{n_stages} stages but only {n_layers} layers: each stage needs a layer, lower the stages")
    if weights is None:
        base, extra = divmod(n_layers, n_stages)
        out, start = [], 0
        for k in range(n_stages):
            end = start + base + (1 if k < extra else 0)
            out.append((start, end))
            start = end
        return out
    if len(weights) != n_layers or not all(is_number(w) and w >= 0 for w in weights):
        raise ManifestError(f"give {n_layers} non-negative finite layer weights, got {len(weights)}")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))
    # best[k][i]: minimal bottleneck cutting layers 0..i into k stages; cut[k][i]: start of the last stage
    inf = float("inf")
    best = [[inf] * (n_layers + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n_layers + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for i in range(k, n_layers + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i] - 1e-12:
                    best[k][i], cut[k][i] = cost, j
    out, end = [], n_layers
    for k in range(n_stages, 0, -1):
        start = cut[k][end]
        out.append((start, end))
        end = start
    return out[::-1]
