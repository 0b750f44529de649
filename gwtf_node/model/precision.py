"""Precision of a run: the dtype a stage computes in, and the dtype of the tensors on its links.

Theory of operation
-------------------
Two choices of the manifest's `train` section, absent from its JSON at their
defaults (a run id of a manifest without them is what it always was):

* `precision` (`Precision`): `fp32` computes everything in float32.
  `bf16-mixed` runs the forward computations of every part (a relay's
  layers; a data node's embedding, final norm and LM head) under
  `torch.autocast(device_type, dtype=torch.bfloat16)`: matrix products and
  attention in bfloat16, what autocast keeps in float32 (norms, softmax,
  reductions) in float32.  The parameters (master weights), the gradient
  accumulators, the all-reduced gradient and the optimizer state stay
  float32 (autocast casts a weight per use, and the gradient of a float32
  leaf is float32); the loss is the float32 cross-entropy of the logits cast
  to float32.  A backward replays the stashed graph, whose ops already carry
  their dtypes, so the autocast state at backward does not matter.
  Autocast applies on the CPU too (torch runs bfloat16 matrix products
  there, natively on CPUs with AVX512-BF16/AMX, emulated elsewhere), so a
  CPU node computes what a GPU node computes up to its kernels, and the
  tests exercise the path without a GPU.  A CUDA device without bfloat16
  (`torch.cuda.is_bf16_supported()` false) and any other device type
  compute in float32 instead (`autocast_supported`).
* `wire_dtype` (`WireDtype`): `fp32` or `bf16`, the dtype of every
  activation and every activation gradient that crosses a link (data ->
  stage 0, stage k -> k + 1, the last stage -> data, and the gradients
  back).  `StageModel` casts what it hands out (an activation, the gradient
  of its input) to the wire dtype and what it receives to its compute
  dtype, so the tensor store, the sender, a re-send after a crash and the
  centralized reference all hold the tensor exactly as it travels; `unpack`
  accepts the wire dtype only.  Top-K composes: the kept values travel in
  the wire dtype, the indices in int32 (6 bytes per kept bfloat16 element,
  `adatopk.sparse_overhead`).  The within-stage all-reduce of gradients
  travels in the wire dtype too (`runtime/node/allreduce.py`: each
  contribution rounded to it once, summed in float32).

On CUDA a node computes in worker threads while the centralized reference
computes in its main thread; cuBLAS chooses its kernels with the workspace
each thread's handle has, and a swarm of two relays per stage differed from
the reference by one float32 ulp in a microbatch's loss.  A fixed workspace
(`CUBLAS_WORKSPACE_CONFIG=:4096:8`, `fix_cublas_workspace`, unless the
environment names one) set as `join` starts on CUDA makes that swarm equal
to the reference on the same GPU, fp32 bit for bit (docs/gpu_check.md); set
only when the part was built, it came too late.  Building a part for CUDA
sets it too, for processes whose first CUDA work is that build (the
reference, the scripts).

fp32 with an fp32 wire is the exact setting of the invariant tests: every
cast is then the identity.  This module is pure Python (torch is imported
inside the helpers that need it): the manifest imports the enums.
"""

from __future__ import annotations

import contextlib
import enum
import os
from typing import Any


class Precision(str, enum.Enum):
    """The manifest's `train.precision`: what a stage computes in."""

    FP32 = "fp32"
    BF16_MIXED = "bf16-mixed"  # autocast to bfloat16; float32 weights, gradients, optimizer state and loss


class WireDtype(str, enum.Enum):
    """The manifest's `train.wire_dtype`: the dtype of activations and their gradients on every link."""

    FP32 = "fp32"
    BF16 = "bf16"


WIRE_DTYPE_NAMES = {WireDtype.FP32: "float32", WireDtype.BF16: "bfloat16"}  # tensors.DTYPES names
WIRE_BYTES = {WireDtype.FP32: 4, WireDtype.BF16: 2}  # bytes per element on the wire


def check_precision(precision: Any, wire_dtype: Any, error: type[Exception]) -> None:
    """Raise `error` with one line naming the field when either choice is not one of its values."""
    if precision not in {p.value for p in Precision}:
        raise error(f"train.precision is {precision!r}; use one of {', '.join(p.value for p in Precision)}")
    if wire_dtype not in {w.value for w in WireDtype}:
        raise error(f"train.wire_dtype is {wire_dtype!r}; use one of {', '.join(w.value for w in WireDtype)}")


def wire_bytes(wire_dtype: str) -> int:
    """Bytes per element of an activation on the wire."""
    return WIRE_BYTES[WireDtype(wire_dtype)]


def wire_torch_dtype(wire_dtype: str) -> Any:
    """The torch dtype of tensors on the wire."""
    import torch

    return torch.bfloat16 if WireDtype(wire_dtype) is WireDtype.BF16 else torch.float32


CUBLAS_WORKSPACE = ":4096:8"  # eight 4-MiB cuBLAS workspaces; torch's documented setting for repeatable kernels


def fix_cublas_workspace(device: Any) -> None:
    """On a CUDA `device` (a torch.device), a fixed cuBLAS workspace in this process's environment unless it
    names one (module doc).  Call it before the process does anything on CUDA: later, what cuBLAS already
    chose stays."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def autocast_supported(device: Any) -> bool:
    """Whether bfloat16 autocast runs on `device` (a torch.device): the CPU, or CUDA with bfloat16."""
    import torch

    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return False


def compute_context(precision: str, device: Any) -> Any:
    """The context a forward computation runs in: bfloat16 autocast for `bf16-mixed` where the device supports
    it, else nothing (float32)."""
    if Precision(precision) is Precision.BF16_MIXED and autocast_supported(device):
        import torch

        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
