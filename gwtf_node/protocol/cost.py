"""The cost model of GWTF, Equation 1 (section IV of the paper).

    d(i, j) = (c_i + c_j)/2 + (lat_ij + lat_ji)/2 + 2*size/(bw_ij + bw_ji)

Every link is used twice per microbatch (activations forward, gradients
backward), so the two directions are averaged.  All times are milliseconds,
bandwidths are Mbit/s and sizes are megabytes; the function is pure.
"""

from __future__ import annotations

BITS_PER_BYTE = 8
MS_PER_S = 1000.0


def transfer_ms(size_mb: float, bw_ab_mbps: float, bw_ba_mbps: float) -> float:
    """The transfer term 2*size/(bw_ab + bw_ba) of Equation 1, in ms."""
    total = bw_ab_mbps + bw_ba_mbps
    if total <= 0:
        raise ValueError(f"bandwidths must be positive, got {bw_ab_mbps} and {bw_ba_mbps} Mbit/s")
    return 2.0 * size_mb * BITS_PER_BYTE / total * MS_PER_S


def link_cost(
    compute_a_ms: float,
    compute_b_ms: float,
    lat_ab_ms: float,
    lat_ba_ms: float,
    bw_ab_mbps: float,
    bw_ba_mbps: float,
    size_mb: float,
) -> float:
    """d(a, b) of Equation 1, in ms."""
    return (
        (compute_a_ms + compute_b_ms) / 2.0
        + (lat_ab_ms + lat_ba_ms) / 2.0
        + transfer_ms(size_mb, bw_ab_mbps, bw_ba_mbps)
    )
