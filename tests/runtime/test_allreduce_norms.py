"""The all-reduce's one-pass check of a chunk: finite values and the squared norm the outlier guard judges."""

import math

import pytest
import torch

from gwtf_node.runtime.node.chunkcheck import NORM_BLOCK, NORM_ROW, checked_chunk, sq_norm


def _exact(t: torch.Tensor) -> float:
    wide = t.double()
    return float(torch.dot(wide, wide))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [0, 1, NORM_ROW - 1, NORM_ROW * 3 + 7, NORM_BLOCK * 2 + NORM_ROW + 5])
def test_the_squared_norm_matches_a_float64_dot(dtype, n):
    t = (torch.randn(n, generator=torch.Generator().manual_seed(n)) * 1e-3).to(dtype)
    got, want = sq_norm(t), _exact(t)
    assert got == pytest.approx(want, rel=1e-6, abs=0.0)  # float32 dots of NORM_ROW values: ~1e-7 apiece


def test_nan_and_infinity_are_found_anywhere_and_huge_finite_values_are_not_mistaken_for_them():
    for bad in (float("nan"), float("inf"), float("-inf")):
        for where in (0, NORM_ROW, NORM_BLOCK + 3, 2 * NORM_BLOCK + NORM_ROW + 1):
            t = torch.ones(2 * NORM_BLOCK + NORM_ROW + 2)
            t[where] = bad
            assert sq_norm(t) is None, (bad, where)
            assert sq_norm(t.bfloat16()) is None, (bad, where)
    t = torch.ones(NORM_ROW * 2)
    t[7] = 3e19  # its square is past float32's range; the value itself is finite
    assert math.isfinite(sq_norm(t)) and sq_norm(t) == pytest.approx(_exact(t), rel=1e-12)


def test_a_bfloat16_chunk_is_kept_in_its_wire_dtype_with_its_norm():
    t = torch.randn(NORM_ROW + 3).bfloat16()
    got = checked_chunk(bytearray(t.view(torch.int16).numpy().tobytes()), torch.bfloat16)
    assert got is not None
    chunk, sq = got
    assert chunk.dtype == torch.bfloat16 and torch.equal(chunk, t)
    assert sq == pytest.approx(_exact(t), rel=1e-6)
    t[5] = float("nan")
    assert checked_chunk(t.view(torch.int16).numpy().tobytes(), torch.bfloat16) is None
