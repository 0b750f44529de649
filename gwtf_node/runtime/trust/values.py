"""Checked values in the daemon: the context `protocol/bounds.py` compares a frame with, and the refusal counts.

`Node._on_frame` asks `Values.refused(peer, msg, payload)` for every decoded
frame before its route: `bounds.check(msg, context)` judges the message's
fields, and the largest finite magnitude of a float tensor payload is judged
by `bounds.check_magnitude` (NaN and infinity are left to the tensor checks
after it, which refuse them).  A frame with a value out of range is refused
(logged and counted by the wire like every refused frame) and counted here
per `bounds.Violation` code, which status.json shows as `refused_values`
(`{code: count}`), with the all-reduce contributions that part owners
refused as outliers (`gradient_outlier`, allreduce.py).

The context is built from what the components hold, read only: this node's
iteration (None while it is joining: its own iteration says nothing yet),
its leader term, the label epoch of each commodity and the units each
neighbour hands it (the flow machine), the capacity the sender announced in
its Hello, the shape and dtype of the stage's activations and the length of
its gradient.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from typing import Any

import torch

from ...protocol import bounds

_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                 "bfloat16": torch.bfloat16}

_FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


class Values:
    """The bounds context of each frame, the check of each frame, and the count of refusals per code."""

    def __init__(self, wire: Any, peers: Any, stage: Any, flows: Any, microbatches: Any, leadership: Any,
                 aggregation: Any) -> None:
        self.wire = wire
        self.peers = peers
        self.stage = stage
        self.flows = flows
        self.microbatches = microbatches
        self.leadership = leadership
        self.aggregation = aggregation  # its all-reducer counts the contributions refused as outliers
        self.counts: Counter[bounds.Violation] = Counter()

    def context(self, sender: str) -> bounds.Context:
        peers, model = self.peers, self.stage.model
        info = peers.get(sender)
        hidden_shape = hidden_dtype = grad_len = None
        if model is not None:
            from ...model.tensors import dtype_name

            hidden_shape = tuple(model.expected_hidden_shape(self.stage.manifest.data.microbatch_size))
            hidden_dtype, grad_len = dtype_name(model.wire_dtype), model.num_params
        placed = peers.stage is not None and not peers.place.joining
        return bounds.Context(
            n_stages=peers.n_stages,
            iteration=self.microbatches.iteration_now() if placed else None,
            term=self.leadership.term(),
            epochs=self.flows.epochs(),
            sender_capacity=info.capacity if info is not None else None,
            units_from_sender=self.flows.units_from(sender),
            hidden_shape=hidden_shape, hidden_dtype=hidden_dtype, grad_len=grad_len)

    def problem(self, sender: str, msg: Any, payload: Any = b"") -> bounds.Problem | None:
        """The frame's first value out of range: the message's fields, then the magnitude of its tensor."""
        problem = bounds.check(msg, self.context(sender))
        if problem is None and (h := getattr(msg, "tensor", None)) is not None and payload is not None \
                and len(payload) == h.nbytes > 0 and h.dtype in _FLOAT_DTYPES:
            values = payload[4 * h.sparse_kept:] if h.sparse_kept else payload  # Top-K: the indices come first
            problem = bounds.check_magnitude(_max_abs(h.dtype, values), type(msg).__name__)
        return problem

    def refused(self, sender: str, msg: Any, payload: Any = b"") -> bool:
        """True if the frame has a value out of range: it is refused (logged by the wire) and counted."""
        problem = self.problem(sender, msg, payload)
        if problem is None:
            return False
        self.counts[problem.code] += 1
        self.wire.refuse(sender, str(problem))
        return True

    def snapshot(self) -> dict[str, int]:
        """status.json `refused_values`: frames refused per code, and all-reduce contributions refused as
        outliers (`gradient_outlier`, allreduce.py)."""
        counts = {code.value: n for code, n in self.counts.items()}
        outliers = getattr(self.aggregation.allreducer, "outliers_refused", 0)
        if outliers:
            key = bounds.Violation.GRADIENT_OUTLIER.value
            counts[key] = counts.get(key, 0) + outliers
        return dict(sorted(counts.items()))


def _max_abs(dtype: str, payload: Any) -> float:
    """The largest finite absolute value of a float tensor's raw bytes (NaN and infinity are not counted here).

    One pass without a copy: `aminmax` over a tensor that wraps the bytes where they are.  NaN and infinity
    (which make that bound non-finite) send it to a second pass that leaves them out; such a frame is refused
    by the tensor checks after this one, so honest traffic never takes it."""
    view = memoryview(payload).cast("B") if not isinstance(payload, memoryview) or payload.format != "B" else payload
    dt = _TORCH_DTYPES[dtype]
    if view.nbytes < dt.itemsize:
        return 0.0
    with warnings.catch_warnings():  # (torch warns of a read-only buffer: this tensor is only read)
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(view, dtype=dt, count=view.nbytes // dt.itemsize)  # aliases the frame, no copy
    lo, hi = torch.aminmax(t)
    mag = max(-float(lo), float(hi)) + 0.0  # (+ 0.0: no -0.0)
    if math.isfinite(mag):
        return mag
    a = t.abs()
    finite = a[torch.isfinite(a)]
    return float(finite.max()) if finite.numel() else 0.0
