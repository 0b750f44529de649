"""The magnitude scan of a tensor frame (runtime/trust/values.py): every float dtype, NaN and infinity left out, no copy."""

from __future__ import annotations

import pytest
import torch

from gwtf_node.model.tensors import pack, pack_topk
from gwtf_node.protocol import bounds
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.trust.values import Values, _max_abs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_largest_finite_magnitude_of_every_float_dtype(dtype):
    t = torch.zeros(2, 3, 8, dtype=dtype)
    t[1, 2, 3] = -96.0
    t[0, 0, 0] = 5.0
    header, payload = pack(t)
    assert _max_abs(header.dtype, payload) == 96.0
    assert _max_abs(header.dtype, bytes(payload)) == 96.0  # read-only bytes, as a frame arrives
    t[0, 1, 1], t[0, 1, 2], t[1, 0, 0] = float("nan"), float("inf"), float("-inf")
    header, payload = pack(t)
    assert _max_abs(header.dtype, payload) == 96.0  # left to the tensor checks, which refuse them
    assert _max_abs(header.dtype, pack(torch.full((4,), float("nan"), dtype=dtype))[1]) == 0.0


def test_an_unaligned_payload_and_an_empty_one():
    raw = bytes(1) + pack(torch.tensor([1.0, -3.0, 2.0]))[1].tobytes()
    assert _max_abs("float32", raw[1:]) == 3.0
    assert _max_abs("float32", b"") == 0.0
    assert _max_abs("float32", bytes(4)) == 0.0 and str(_max_abs("float32", bytes(4))) == "0.0"


def test_a_frame_with_a_huge_value_is_refused_and_counted_by_its_code():
    class Wire:
        refused: list = []

        def refuse(self, peer, why, code=None):
            self.refused.append((peer, why))

    values = Values.__new__(Values)
    values.wire, values.counts = Wire(), __import__("collections").Counter()
    values.context = lambda sender: bounds.Context(n_stages=2)
    t = torch.zeros(2, 4)
    header, payload = pack(t)
    msg = m.Forward("d0", 1, 0, ("d0",), header)
    assert not values.refused("p", msg, payload)
    t[1, 1] = 1e9
    header, payload = pack(t)
    assert values.refused("p", m.Forward("d0", 1, 0, ("d0",), header), payload)
    assert values.counts[bounds.Violation.TENSOR_MAGNITUDE] == 1
    header, payload = pack_topk(t, 2)  # Top-K: the indices come first, the values are scanned
    assert values.refused("p", m.Forward("d0", 1, 0, ("d0",), header), payload)
