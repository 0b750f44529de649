"""Checked values in the daemon: the context `protocol/bounds.py` compares a frame with, and the refusal counts.

`Node._on_frame` calls `bounds.check(msg, values.context(peer))` for every
decoded frame before its route; a frame with a value out of range is refused
(logged, counted by the wire like every refused frame) and counted here per
`bounds.Violation` code, which status.json shows as `refused_values`
(`{code: count}`).  A component that finds a value out of range later (the
magnitude of a tensor's values, measured once the payload is unpacked; an
outlier contribution to an all-reduce) raises `ValueRefused`, or calls
`note`, and is counted the same way.

The context is built from what the components hold, read only: this node's
iteration (None while it is joining: its own iteration says nothing yet),
its leader term, the label epoch of each commodity and the units each
neighbour hands it (the flow machine), the capacity the sender announced in
its Hello, the shape and dtype of the stage's activations and the length of
its gradient.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from ..protocol import bounds
from .wire import FrameRefused

log = logging.getLogger("gwtf.node")


class ValueRefused(FrameRefused):
    """A frame refused for a value out of its bounds; `problem` holds the code."""

    def __init__(self, problem: bounds.Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class Values:
    """The bounds context of each frame and the count of refusals per code."""

    def __init__(self, peers: Any, stage: Any, flows: Any, microbatches: Any, leadership: Any) -> None:
        self.peers = peers
        self.stage = stage
        self.flows = flows
        self.microbatches = microbatches
        self.leadership = leadership
        self.refused: Counter[bounds.Violation] = Counter()

    def context(self, sender: str) -> bounds.Context:
        peers, model = self.peers, self.stage.model
        info = peers.get(sender)
        machine = self.flows.machine
        hidden_shape = hidden_dtype = grad_len = None
        if model is not None:
            from ..model.tensors import dtype_name

            hidden_shape = tuple(model.expected_hidden_shape(self.stage.manifest.data.microbatch_size))
            hidden_dtype, grad_len = dtype_name(model.dtype), model.num_params
        placed = peers.stage is not None and not peers.place.joining
        return bounds.Context(
            n_stages=peers.n_stages,
            iteration=self.microbatches.iteration_now() if placed else None,
            term=self.leadership.term(),
            epochs=machine.epoch if machine is not None else {},
            sender_capacity=info.capacity if info is not None else None,
            units_from_sender=bounds.units_from(machine.inn, sender) if machine is not None else 0,
            hidden_shape=hidden_shape, hidden_dtype=hidden_dtype, grad_len=grad_len)

    def check(self, sender: str, msg: Any) -> bounds.Problem | None:
        """The frame's first value out of range (counted), or None."""
        problem = bounds.check(msg, self.context(sender))
        if problem is not None:
            self.note(problem)
        return problem

    def note(self, problem: bounds.Problem) -> None:
        self.refused[problem.code] += 1

    def snapshot(self) -> dict[str, int]:
        """status.json `refused_values`: refusals per code."""
        return {code.value: n for code, n in sorted(self.refused.items(), key=lambda kv: kv[0].value)}
