"""The Top-K of a compressed run at the crossings of the centralized chain: what a compressed swarm computes.

A pipeline of S stages has S + 1 crossings where a tensor changes node: the
embedding into stage 0 (crossing 0), stage k's output into stage k + 1
(crossing k + 1), the last stage's output into the head (crossing S); the
gradients cross them backwards.  `Crossings` applies to the centralized chain
(`reference.run_microbatch`) what the tensor channel does to those tensors
in a run with `train.compression` (`runtime/node/linkcompress.py`,
`runtime/node/microbatches.py`): the forward tensor of crossing i is rebuilt from
its Top-K at `forward[i]`, and its gradient either at the activation's own
indices (`Gradients.ALIGNED`) or from its own Top-K at `backward[i]`
(`Gradients.TOPK`).  A ratio whose sparse payload would not be smaller than
the dense tensor leaves that crossing dense (`adatopk.kept_count`), as on the
wire.  With the ratios the senders of a swarm chose, centralized training
with these crossings is what that swarm computes (tests/swarm/test_compression_swarm.py),
and it measures the loss of a compression rule without starting a swarm
(`scripts/bench_compression.py --centralized`).  With a bf16 wire the
tensors at the crossings are the bfloat16 ones the parts hand out
(`precision.py`), so the Top-K is taken of them, as the sender takes it, and
its overhead counts 2-byte values (`kept_count` reads the element size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .adatopk import Gradients, kept_count
from .compression import gather, topk_decode, topk_encode


def _topk(t: torch.Tensor, ratio: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    k = kept_count(t.numel(), ratio, t.element_size())
    if k is None:
        return t, None
    idx, vals = topk_encode(t, k)
    return topk_decode(idx, vals, tuple(t.shape)), idx


def _at(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return topk_decode(idx, gather(t, idx), tuple(t.shape))


@dataclass(frozen=True)
class Crossings:
    """Per crossing, the ratio of its forward tensor and of its gradient (1: dense), and the gradient rule."""

    forward: Sequence[float]
    backward: Sequence[float]
    gradients: Gradients = Gradients.ALIGNED

    @classmethod
    def uniform(cls, stages: int, ratio: float, gradients: Gradients = Gradients.ALIGNED) -> "Crossings":
        return cls([ratio] * (stages + 1), [ratio] * (stages + 1), gradients)

    def __post_init__(self) -> None:
        if len(self.forward) != len(self.backward):
            raise ValueError(f"{len(self.forward)} forward ratios but {len(self.backward)} backward ones")

    def forward_at(self, i: int, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tensor crossing i delivers, and the indices it kept (None: it went dense)."""
        return _topk(t, self.forward[i])

    def backward_at(self, i: int, g: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
        """The gradient crossing i delivers back, for a forward tensor that kept `kept`."""
        if kept is not None and self.gradients is Gradients.ALIGNED:
            return _at(g, kept)
        return _topk(g, self.backward[i])[0]
