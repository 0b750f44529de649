"""Stage execution: one node's share of the model, its optimizer and its in-flight microbatches.

Theory of operation
-------------------
Every node builds its own part only (DESIGN.md "Roles"), from the manifest:

* data role: token embedding (+ GPT's position embedding), final norm, LM head
  and the loss: the paper's first and last stage, on the same node;
* relay stage k: decoder layers `manifest.stages[k]`, plus what those layers
  need from the model body: the rotary embedding (parameter-free) and the
  masks, recomputed per microbatch from the shape of the input (`parts.py`).

`build_stage` builds the family's HF model as a `meta` skeleton, keeps the
part's modules and gives only their parameters storage, each drawn from a
generator seeded by (train.seed, the parameter's HF name) on the CPU and then
moved to the device, or read from `model.weights` (`materialize.py`,
`weights.py`).  So a relay allocates its stage, not the model; every node
starts from the parameters the centralized model would have, whichever device
it computes on; and the chain data.embed -> relay 0 .. S-1 -> data.head
computes exactly the family's `*ForCausalLM` (tested).

Gradients.  A forward stashes the autograd graph under the microbatch key
(the relay's stage input is a leaf that requires grad); the matching backward
calls `torch.autograd.grad` for the stage input and the part's parameters and
*adds* the parameter gradients to float32 accumulators owned by this object
(not `.grad`), so a dropped microbatch (`drop`) contributes nothing and
`grad_vector()` is exactly the sum over the microbatches that completed here.
A part's linear layers (a relay's, the data part's LM head) compute with
their weights detached and hand their weights' gradients over as two factors
each, multiplied out when they are added (`linearfactors.py`: the same bits
as autograd's, a tenth of the memory for a held microbatch).
The aggregation phase sums these vectors over the relays of a stage (and the
data nodes), and every copy applies `apply_mean_grad(sum, count)`: `.grad`
is set to sum/count, the optimizer steps, and accumulators and stash are
cleared: a stashed graph refers to the old weights and cannot be used after
a step, and a microbatch that had not completed is re-queued by its data node
anyway (DESIGN.md "The invariant").

Dropout is refused by the manifest, and all parts run in eval mode, so a
forward is a pure function of (weights, input): a stage recomputed after a
crash (paper V-D) reproduces the same activation.

A StageModel is safe to call from several worker threads: every public method
holds one lock, so calls on one node are serialized.  transformers is
imported on the first `build_stage`, not at import time (it takes seconds).

Precision (`precision.py`).  Every forward computation runs in the run's
`compute_context` (bfloat16 autocast for `train.precision = bf16-mixed`);
parameters, accumulators and optimizer state stay float32.  What a part
hands out to travel (an activation, the gradient of its input) is cast to
the run's wire dtype (`wire_dtype`), what it receives is cast back to float32
on its device: the node's tensor store, the wire and the centralized chain
hold the same tensors.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable

import torch
import torch.nn.functional as F
from torch import nn

from .linearfactors import Factors, LinearFactors, Recording, add_all
from .manifest import ManifestError, RunManifest
from .materialize import build_full_model, build_parts  # noqa: F401  (build_full_model: re-exported)
from .parts import DataPart, RelayPart  # noqa: F401  (re-exported)
from .precision import compute_context, fix_cublas_workspace, wire_torch_dtype
from .tensors import BufferFile

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STATE_FORMAT = "gwtf-stage/1"  # tag of state_bytes(), checked on load


def part_name(role: str, stage: int | None) -> str:
    """"data" or "stage<k>": the name of a part in results and checkpoints."""
    return "data" if role == "data" else f"stage{stage}"


# ---- the stage object --------------------------------------------------------------


@dataclass
class _Stash:
    inp: torch.Tensor | None  # relay: the stage input (a leaf with requires_grad); data: the input ids
    out: torch.Tensor  # the output, still attached to its graph
    rec: Recording | None = None  # relay: the factored linear layers' inputs and outputs (linearfactors.py)


class StageModel:
    """One node's part: module, optimizer, gradient accumulators and in-flight microbatches."""

    def __init__(
        self, manifest: RunManifest, role: str, stage: int | None, module: nn.Module, names: list[str], device: Any
    ) -> None:
        self.manifest = manifest
        self.role = role
        self.stage = stage
        self.device = torch.device(device)
        fix_cublas_workspace(self.device)
        self.module = module
        self.names = names  # HF names of `params`, in order (a tied parameter once, under its first name)
        self.params = list(module.parameters())  # deduplicated: GPT's tied wte/lm_head is one tensor
        assert len(self.names) == len(self.params)
        self.dtype = torch.float32
        self.hidden_size = manifest.dims.hidden
        self.vocab_size = manifest.dims.vocab
        self.num_params = sum(p.numel() for p in self.params)
        self.optimizer = _make_optimizer(manifest, self.params)
        self._acc = [torch.zeros(p.shape, dtype=torch.float32, device=self.device) for p in self.params]
        self.accumulated = 0  # microbatches whose backward was accumulated since the last step
        self.steps = 0
        self._stash: dict[Hashable, _Stash] = {}
        self._held: dict[Hashable, list] = {}  # per-microbatch parameter gradients (tensors, Factors), not yet counted
        self._counted: list[list] = []  # held gradients that count, not added yet (`count_held`)
        self._factors = LinearFactors(module, self.params)  # the linear weights' gradients as factors
        self._lock = threading.RLock()

    @property
    def name(self) -> str:
        return part_name(self.role, self.stage)

    def expected_hidden_shape(self, microbatch_size: int | None = None) -> tuple[int, int, int]:
        """Shape of the activations and gradients this node receives: [B, seq_len, hidden]."""
        b = microbatch_size if microbatch_size is not None else self.manifest.data.microbatch_size
        return (b, self.manifest.data.seq_len, self.hidden_size)

    @property
    def in_flight(self) -> int:
        return len(self._stash)

    def has(self, key: Hashable) -> bool:
        return key in self._stash

    @property
    def wire_dtype(self) -> torch.dtype:
        """The dtype of the activations and gradients this part hands out and receives (train.wire_dtype)."""
        return wire_torch_dtype(self.manifest.train.wire_dtype)

    def _compute(self) -> Any:
        """The context of a forward computation: bfloat16 autocast for bf16-mixed (precision.py), else none."""
        return compute_context(self.manifest.train.precision, self.device)

    # ---- relay ---------------------------------------------------------------

    def forward(self, key: Hashable, hidden: torch.Tensor) -> torch.Tensor:
        """Run the stage on `hidden` [B, T, H], stash the graph under `key` (replacing one there), return the output."""
        self._require("relay", "forward")
        self._check_hidden(hidden, "forward input")
        with self._lock:
            x = hidden.detach().to(self.device, self.dtype).requires_grad_(True)
            with torch.enable_grad(), self._compute(), self._factors.recording() as rec:
                y = self.module(x)
            self._stash[key] = _Stash(inp=x, out=y, rec=rec)
            return y.detach().to(self.wire_dtype)

    def backward(self, key: Hashable, grad_out: torch.Tensor, *, hold: bool = False) -> torch.Tensor:
        """Gradient w.r.t. the stage input of the stashed microbatch; adds parameter gradients; frees the stash.

        `hold`: keep this microbatch's parameter gradients apart (`commit_many` adds
        them, `discard` forgets them) until it is known to count: crash
        recovery may give an attempt up after its backward ran here.  A held
        microbatch keeps its linear weights' gradients as their factors, where
        those are the smaller (linearfactors.py), the others as float32 copies.
        """
        self._require("relay", "backward")
        with self._lock:
            st = self._pop(key)
            self._check_hidden(grad_out, "gradient", like=st.out)
            g_in, grads = self._factors.grads(st.rec, st.out, st.inp, self.params,
                                              grad_out.to(self.device, st.out.dtype), hold=hold)
            if hold:
                self._held[key] = [g if g is None or isinstance(g, Factors) else g.detach().float() for g in grads]
            else:
                self._accumulate(tuple(grads))
            return g_in.detach().to(self.wire_dtype)

    def commit(self, key: Hashable) -> bool:
        """Add the held gradients of `key` to the accumulators (see `backward(hold=True)`); False if none."""
        return self.commit_many([key]) == 1

    def commit_many(self, keys: list) -> int:
        """Add the held gradients of `keys`, in this order, to the accumulators: each parameter's as
        `linearfactors.add_all` adds them (the factors of consecutive keys multiplied out together); returns how
        many keys were held."""
        with self._lock:
            held = [self._held.pop(k) for k in keys if k in self._held]
            self._add(held)
            self.accumulated += len(held)
            return len(held)

    def count_held(self, key: Hashable) -> bool:
        """The held gradients of `key` count, the microbatch not counted here (a data node's head gradients of a
        microbatch that completed): they are added with those counted after them, a chunk (`add_all`) once their
        factors reach half the float32 bytes of their weight's gradient, and at `grad_vector` at the latest;
        False if none held."""
        with self._lock:
            grads = self._held.pop(key, None)
            if grads is None:
                return False
            self._counted.append(grads)
            if any(2 * sum(g[j].nbytes for g in self._counted if isinstance(g[j], Factors)) >= 4 * self._acc[j].numel()
                   for j in self._factors.factored):
                self._add_counted()
            return True

    def _add_counted(self) -> None:
        self._add(self._counted)
        self._counted.clear()

    def discard(self, key: Hashable) -> bool:
        """Forget the held gradients of `key` (its attempt does not count); False if none."""
        with self._lock:
            return self._held.pop(key, None) is not None

    @property
    def held(self) -> list:
        with self._lock:
            return list(self._held)

    def stashed_input(self, key: Hashable) -> torch.Tensor:
        """The stage input kept for `key` (relay) or its input ids (data): what crash recovery re-sends (V-D)."""
        with self._lock:
            if key not in self._stash:
                raise KeyError(f"microbatch {key!r} is not stashed on {self.name}")
            inp = self._stash[key].inp.detach()
            return inp.to(self.wire_dtype) if inp.is_floating_point() else inp  # a relay's input, as it came

    def drop(self, key: Hashable) -> bool:
        """Forget a stashed microbatch without a gradient contribution; False if it was not there."""
        with self._lock:
            return self._stash.pop(key, None) is not None

    def profile_ms(self, repeats: int = 2) -> float:
        """Compute time of one microbatch here, in ms (the best of `repeats`): forward and backward of the stage
        (a data node: embedding, head and loss, and their backward) on random input.  Nothing of the part changes:
        no stash, no gradient kept, and the random number generators are restored (a run's dropout draws stay
        those of centralized training)."""
        devices = [self.device] if self.device.type == "cuda" else []
        b = self.manifest.data.microbatch_size
        best = math.inf
        with torch.random.fork_rng(devices=devices), self._lock:
            for _ in range(repeats):
                t0 = time.perf_counter()
                with torch.enable_grad(), self._compute():
                    if self.role == "relay":
                        x = torch.randn(self.expected_hidden_shape(b), device=self.device, dtype=self.dtype,
                                        requires_grad=True)
                        out = self.module(x).float().sum()
                        torch.autograd.grad(out, [x, *self.params], allow_unused=True)
                    else:
                        ids = torch.randint(0, self.vocab_size, (b, self.manifest.data.seq_len), device=self.device)
                        h = self.module.embed(ids)
                        logits = self.module.head(h)
                        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids.reshape(-1))
                        torch.autograd.grad(loss, self.params, allow_unused=True)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                best = min(best, (time.perf_counter() - t0) * 1000.0)
        return best

    # ---- data --------------------------------------------------------------------

    def embed(self, key: Hashable, input_ids: torch.Tensor) -> torch.Tensor:
        """Token (+ position) embedding of `input_ids` [B, T]; stashed until `embed_backward`."""
        self._require("data", "embed")
        if input_ids.ndim != 2 or input_ids.dtype != torch.long:
            raise ValueError(f"input ids must be an int64 [B, T] tensor, got {input_ids.dtype} {tuple(input_ids.shape)}")
        with self._lock:
            ids = input_ids.to(self.device)
            with torch.enable_grad(), self._compute(), _sparse_embeddings(self.module):
                h = self.module.embed(ids)
            self._stash[key] = _Stash(inp=ids, out=h)
            return h.detach().to(self.wire_dtype)

    def head_loss(self, key: Hashable, hidden: torch.Tensor, targets: torch.Tensor,
                  *, hold: bool = False) -> tuple[float, torch.Tensor]:
        """Mean token cross-entropy of the microbatch and its gradient w.r.t. `hidden`; adds head/norm gradients.

        Forward and backward of the head happen in this one call, nothing is
        stashed.  `hold`: keep the head gradients apart until `count_held(key)`
        (the microbatch completed end to end) or `discard(key)`.
        """
        self._require("data", "head_loss")
        self._check_hidden(hidden, "last-stage output")
        if targets.shape != hidden.shape[:2]:
            raise ValueError(f"targets {tuple(targets.shape)} do not match hidden {tuple(hidden.shape)} of {key!r}")
        with self._lock:
            h = hidden.detach().to(self.device, self.dtype).requires_grad_(True)
            with torch.enable_grad():
                with self._compute(), self._factors.recording() as rec:
                    logits = self.module.head(h)  # [B, T, V]
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                       targets.to(self.device).reshape(-1))
            g_h, grads = self._factors.grads(rec, loss, h, self.params, None, hold=hold)
            if hold:  # (the head weight's gradient as its factors, multiplied out when counted)
                self._held[key] = grads
            else:
                self._accumulate(tuple(grads), count=False)
            return float(loss.detach()), g_h.detach().to(self.wire_dtype)

    def embed_backward(self, key: Hashable, grad_hidden0: torch.Tensor) -> None:
        """Add the embedding gradients of the stashed microbatch; this completes it on the data node."""
        self._require("data", "embed_backward")
        with self._lock:
            st = self._pop(key)
            self._check_hidden(grad_hidden0, "gradient", like=st.out)
            grads = torch.autograd.grad(st.out, self.params, grad_hidden0.to(self.device, st.out.dtype), allow_unused=True)
            self._accumulate(grads)

    # ---- aggregation ---------------------------------------------------------------

    def grad_vector(self) -> torch.Tensor:
        """Sum of the parameter gradients since the last step: 1-D float32 on the CPU, params in `names` order.
        The aggregation begins here: the part lets go of its weights' compute copies (linearfactors.py) until the
        next forward."""
        with self._lock:
            self._add_counted()
            self._factors.forget_casts()
            return torch.cat([a.reshape(-1) for a in self._acc]).cpu()

    def apply_mean_grad(self, flat: torch.Tensor, count: int | float) -> int:
        """Step with gradient `flat / count`, then clear the accumulators and the stash.

        `flat` is the sum of `grad_vector()` over all copies of this part, and
        `count` the number of microbatches that went into it.  With `count <= 0`
        no microbatch completed: nothing is stepped (AdamW would still move
        weights by decay and momentum), but accumulators and stash are cleared.
        Returns the number of stashed microbatches dropped.
        """
        if flat.ndim != 1 or flat.numel() != self.num_params:
            raise ValueError(f"{self.name} has {self.num_params} parameters, got a gradient of shape {tuple(flat.shape)}")
        with self._lock:
            self._factors.forget_casts()
            if count > 0:
                flat = flat.to(self.device, torch.float32)
                offset = 0
                for p in self.params:
                    n = p.numel()
                    p.grad = (flat[offset : offset + n] / count).view_as(p).to(p.dtype)
                    offset += n
                clip = self.manifest.train.grad_clip_norm
                if clip is not None:  # the part's mean gradient, clipped (manifest.TrainSpec.grad_clip_norm)
                    torch.nn.utils.clip_grad_norm_(self.params, clip)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.steps += 1
            for a in self._acc:
                a.zero_()
            self._counted.clear()  # (counted after the gradient vector was taken: as if added, then cleared)
            self.accumulated = 0
            dropped = len(self._stash)
            self._stash.clear()
            self._held.clear()
            return dropped

    # ---- state -----------------------------------------------------------------------

    def param_vector(self) -> torch.Tensor:
        with self._lock:
            return torch.cat([p.detach().float().reshape(-1) for p in self.params]).cpu()

    def state_hash(self) -> str:
        """sha256 of the parameter names and values: equal on every node that holds the same weights."""
        h = hashlib.sha256()
        with self._lock:
            for name, p in zip(self.names, self.params):
                h.update(name.encode() + b"\0")
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def state_bytes(self) -> bytes:
        """Weights and optimizer state, for a newcomer taking over this stage (paper V-B)."""
        with self._lock:
            state = {
                "format": STATE_FORMAT,
                "run_id": self.manifest.run_id,
                "part": self.name,
                "steps": self.steps,
                "names": list(self.names),
                "params": [p.detach().cpu() for p in self.params],
                "optimizer": self.optimizer.state_dict(),
            }
            buf = io.BytesIO()
            torch.save(state, buf)
            return buf.getvalue()

    def load_state_bytes(self, b: bytes | bytearray | memoryview) -> None:
        """Replace weights and optimizer state with `state_bytes()` of the same part of the same run."""
        try:
            state = torch.load(BufferFile(b), map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises several unrelated types for a corrupt archive
            raise ValueError(f"stage state is not readable: {type(e).__name__}: {e}") from None
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"stage state is not in format {STATE_FORMAT}")
        if state["run_id"] != self.manifest.run_id or state["part"] != self.name:
            raise ValueError(
                f"stage state is for {state['part']} of run {state['run_id']}, not {self.name} of {self.manifest.run_id}"
            )
        if state["names"] != self.names or any(
            t.shape != p.shape for t, p in zip(state["params"], self.params)
        ):
            raise ValueError(f"stage state does not match the parameters of {self.name}")
        with self._lock:
            with torch.no_grad():
                for p, t in zip(self.params, state["params"]):
                    p.copy_(t)
            self.optimizer.load_state_dict(state["optimizer"])
            self.steps = int(state["steps"])
            self._factors.forget_casts()
            for a in self._acc:
                a.zero_()
            self._counted.clear()
            self.accumulated = 0
            self._stash.clear()

    # ---- internals -------------------------------------------------------------------

    def _require(self, role: str, op: str) -> None:
        if self.role != role:
            raise RuntimeError(f"{op} is a {role}-node operation, but this is {self.name}")

    def _pop(self, key: Hashable) -> _Stash:
        try:
            return self._stash.pop(key)
        except KeyError:
            raise KeyError(f"microbatch {key!r} has no stashed forward on {self.name}") from None

    def _check_hidden(self, t: torch.Tensor, what: str, like: torch.Tensor | None = None) -> None:
        if like is not None:
            if t.shape != like.shape:
                raise ValueError(f"{what} has shape {tuple(t.shape)}, expected {tuple(like.shape)} on {self.name}")
            return
        if t.ndim != 3 or t.shape[2] != self.hidden_size or t.shape[1] > self.manifest.dims.max_positions:
            raise ValueError(
                f"{what} has shape {tuple(t.shape)}, expected [B, T <= {self.manifest.dims.max_positions}, "
                f"{self.hidden_size}] on {self.name}"
            )

    def _accumulate(self, grads: tuple[torch.Tensor | None, ...], count: bool = True) -> None:
        self._add([grads])
        if count:
            self.accumulated += 1

    def _add(self, held: list) -> None:
        """Add several microbatches' gradients (each a list in `params` order), each parameter's by `add_all`."""
        for j, acc in enumerate(self._acc):
            add_all(acc, [grads[j] for grads in held])


@contextlib.contextmanager
def _sparse_embeddings(module: nn.Module):
    """The part's embedding lookups record sparse gradients meanwhile: a microbatch's embedding gradient is its
    tokens' rows, added to the float32 accumulator where they are, where a dense one is the whole table's (49,152
    x 576 floats for a 135M model, written and added per microbatch: 60-76 ms of the data node's CPU, against 0.1
    ms).  Only the forwards run here record it; the modules are left as they were."""
    embs = [m for m in module.modules() if isinstance(m, nn.Embedding) and not m.sparse]
    for m in embs:
        m.sparse = True
    try:
        yield
    finally:
        for m in embs:
            m.sparse = False


def _make_optimizer(manifest: RunManifest, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    t = manifest.train
    if t.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=t.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay)
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    raise ManifestError(f"train.optimizer is {t.optimizer!r}; use adamw or sgd")


def build_stage(
    manifest: RunManifest,
    role: str,
    stage: int | None = None,
    device: Any = "cpu",
    *,
    full: "PreTrainedModel | None" = None,
) -> StageModel:
    """This node's part of the model: `role` "data", or "relay" with `stage` in 0..S-1 (module doc).

    `full`: cut the part out of this already built model instead (its
    parameters, shared with it: tests and scripts that hold a whole model).
    """
    _check_part(manifest, role, stage)
    if full is not None:
        module: nn.Module = DataPart(manifest.model.family, full) if role == "data" else \
            RelayPart(manifest.model.family, full, *manifest.stages[stage])
        name_of = {id(p): n for n, p in full.named_parameters()}
        names = [name_of[id(p)] for p in module.parameters()]
        module.to(torch.device(device))
        module.eval()
    else:
        (module,) = build_parts(manifest, [(role, stage)], device)
        names = module.hf_param_names
    return StageModel(manifest, role, stage, module, names, device)


def build_stages(manifest: RunManifest, wanted: list[tuple[str, int | None]], device: Any = "cpu") -> list[StageModel]:
    """Several parts ((role, stage) pairs) from one skeleton, each as `build_stage` builds it (the reference)."""
    for role, stage in wanted:
        _check_part(manifest, role, stage)
    modules = build_parts(manifest, wanted, device)
    return [StageModel(manifest, role, stage, m, m.hf_param_names, device) for (role, stage), m in zip(wanted, modules)]


def _check_part(manifest: RunManifest, role: str, stage: int | None) -> None:
    if role == "data":
        if stage is not None:
            raise ValueError("a data node holds no relay stage: pass stage=None")
    elif role == "relay":
        if not isinstance(stage, int) or not 0 <= stage < manifest.num_stages:
            raise ValueError(f"relay stage {stage!r} does not exist: the run has stages 0..{manifest.num_stages - 1}")
    else:
        raise ValueError(f"role is {role!r}; use data or relay")
