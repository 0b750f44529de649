"""The data part's head and loss with the head weight's gradient kept as its two factors until it is counted.

A data node holds each microbatch's head gradients from its head and loss
until the microbatch completes end to end (`StageModel.head_loss(hold=True)`,
`commit`): crash recovery may give the attempt up meanwhile.  The LM head's
weight gradient is a vocabulary x hidden matrix, 4 V H bytes (113 MB for a
49,152-token vocabulary at hidden 576) per microbatch in flight, where what
it is made of is much smaller: the gradient of the logits [B T, V] and the
head's input [B T, H], one matrix product apart (W's gradient is
`dlogits^T @ x`).  `head_grads` computes the loss, the gradient of the
last-stage output and every other parameter gradient as autograd did for the
whole head, and stops short of that product: the head weight's entry is a
`Factors`, multiplied out when the gradient is added (`product`), or at once
where the factors would take more memory than the product (long sequences:
B T (V + H) > V H).

The product is the one autograd computes for a linear layer's weight, on the
same operands (under autocast the bfloat16 logits' gradient and the
bfloat16 copy of the input, the result cast to float32): the same bits
(tests/model/test_headgrad.py compares them with autograd's, in float32 and
under autocast).  The loss, the input's gradient and the other parameters'
gradients are autograd's, in two passes (the head, then the norm with the
head input's gradient) whose operations are those of one pass.  Every family
this project builds (families.py) has an `nn.Linear` head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Factors:
    """A linear layer's weight gradient as its factors: `grad_out` [N, V] and `inp` [N, H] (the layer's input in the
    dtype it computed in).  `transposed`: the weight is stored [H, V] (GPT-2's Conv1D), its gradient `inp^T @
    grad_out`."""

    grad_out: torch.Tensor
    inp: torch.Tensor
    transposed: bool = False

    @property
    def nbytes(self) -> int:
        return self.grad_out.numel() * self.grad_out.element_size() + self.inp.numel() * self.inp.element_size()

    def product(self) -> torch.Tensor:
        """The weight's gradient in float32, [V, H] ([H, V] transposed): what autograd computes for it."""
        if self.transposed:
            return self.inp.t().mm(self.grad_out).float()
        return self.grad_out.t().mm(self.inp).float()


def head_grads(module: nn.Module, params: list[nn.Parameter], h: torch.Tensor, targets: torch.Tensor,
               compute: Callable) -> tuple[torch.Tensor, torch.Tensor, list]:
    """(loss, gradient of `h`, parameter gradients in `params` order) of `module.lm_head(module.norm(h))` and its
    mean token cross-entropy against `targets`, the head weight's gradient a `Factors` where they are the smaller
    (module doc)."""
    head = module.lm_head
    if not isinstance(head, nn.Linear):
        raise TypeError(f"the LM head is a {type(head).__name__}, not an nn.Linear")
    with torch.enable_grad():
        with compute():
            n = module.norm(h)
        x = n.detach().requires_grad_(True)
        with compute():
            logits = head(x)  # [B, T, V]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        bias = [head.bias] if head.bias is not None and head.bias.requires_grad else []
        g_logits, g_x, *g_bias = torch.autograd.grad(loss, [logits, x, *bias])
        rest = [p for p in params if p is not head.weight and all(p is not b for b in bias)]
        g_h, *g_rest = torch.autograd.grad(n, [h, *rest], g_x, allow_unused=True)
    v, hidden = head.weight.shape
    factors = Factors(g_logits.detach().reshape(-1, v), x.detach().to(logits.dtype).reshape(-1, hidden))
    weight = factors if factors.nbytes < head.weight.numel() * 4 else factors.product()
    by_param = {id(p): g for p, g in zip(rest, g_rest)}
    by_param.update({id(b): g for b, g in zip(bias, g_bias)})
    by_param[id(head.weight)] = weight
    return loss.detach(), g_h, [by_param[id(p)] for p in params]


def materialized(g: torch.Tensor | Factors | None) -> torch.Tensor | None:
    """A parameter gradient as float32, a `Factors` multiplied out."""
    if g is None:
        return None
    return g.product() if isinstance(g, Factors) else g.float()
