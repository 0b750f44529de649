"""Building a part: the model skeleton on `meta`, this part's parameters only, each from its own seed.

Theory of operation
-------------------
A node allocates its own part and nothing else.  It builds the family's HF
`*ForCausalLM` on the `meta` device (shapes, no storage: milliseconds and no
memory even for billions of parameters), takes its part's modules out of that
skeleton (`parts.py`), and gives each of the part's parameters real storage,
one tensor at a time: drawn on the CPU, then moved to the node's device.  A
relay of stage k thus holds its layers, the data node its embedding (+ GPT's
positions), final norm and LM head; the peak is the part plus one tensor.

Initialization.  Every parameter is drawn from its own `torch.Generator`,
seeded with the first 8 bytes of sha256(f"{train.seed}\\0{HF name}"), where the
HF name is the parameter's name in the full model (`model.layers.3.mlp.up_proj
.weight`; a tied LM head is drawn once, under the embedding's name).  So a
parameter's value depends on the run's seed and its name only, not on which
node draws it, what else that node builds, or its device (drawing on the CPU
and then moving gives a CUDA node the CPU's numbers), and the centralized
reference (`reference.build_chain`), which builds every part the same way,
starts from the same parameters as the swarm.  Values depend on torch's CPU
normal sampler, so nodes of one run should use one torch release (as before,
when every node drew the whole model from `torch.manual_seed`).

The distributions are transformers 5's `_init_weights` (PreTrainedModel's
generic rule, which LLaMA, Mistral and Qwen2 use unchanged, and GPT-2's
override), with std = `config.initializer_range` (0.02 by default):

* Linear and GPT-2 Conv1D weights: normal(0, std); their biases: zeros;
* GPT-2's residual projections (`attn.c_proj.weight`, `mlp.c_proj.weight`):
  normal(0, std / sqrt(2 * n_layer)), the GPT-2 paper's scaled init that
  transformers applies;
* Embedding weights: normal(0, std), the `padding_idx` row (pad_token_id) zero;
* LayerNorm / RMSNorm: weight ones, bias zeros;
* a parameter of any other module is refused (ManifestError): a family added
  to the table must say how its parameters are drawn.

Non-persistent buffers (the rotary embedding's `inv_freq`) are recomputed, not
left uninitialised: a relay builds its own rotary module on the CPU from the
config (`parts.fresh_rotary`).  Anything still on `meta` after
materialization is an error.

With `model.weights`, the same walk reads each parameter from the checkpoint
instead of drawing it (`weights.py`: only this part's tensors are read).

`build_full_model` materializes every part of the skeleton the same way: the
whole model as a node's parts would hold it (tests, scripts).
"""

from __future__ import annotations

import hashlib
import math
import threading
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from .families import Family, family as family_of, get_path
from .manifest import ManifestError, RunManifest
from .parts import fresh_rotary
from .weights import WeightsReader, open_weights

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_SKELETON_LOCK = threading.Lock()  # one skeleton built at a time (HF model construction is not known thread-safe)


def build_skeleton(manifest: RunManifest) -> "PreTrainedModel":
    """The family's HF model on the meta device: every module, no storage."""
    fam = family_of(manifest.model.family)
    config_cls, model_cls = fam.classes()
    try:
        config = config_cls(**manifest.model.config)
    except (TypeError, ValueError) as e:
        raise ManifestError(f"model.config is not a valid {fam.name} config: {e}") from None
    with _SKELETON_LOCK, torch.device("meta"):  # draws nothing from torch's RNG (meta tensors hold no values)
        try:
            model = model_cls(config)
        except (TypeError, ValueError) as e:
            raise ManifestError(f"model.config is not a valid {fam.name} config: {e}") from None
    model.eval()
    return model


def parameter_seed(seed: int, name: str) -> int:
    """The generator seed of parameter `name` (its HF name) in a run seeded `seed`."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def init_parameter(fam: Family, config: Any, seed: int, name: str, module: nn.Module, local: str,
                   shape: tuple[int, ...]) -> torch.Tensor:
    """The initial value of parameter `name` (`module.<local>`), float32 on the CPU (module doc)."""
    std = getattr(config, "initializer_range", None) or 0.02
    kind = type(module).__name__
    gen = torch.Generator().manual_seed(parameter_seed(seed, name))
    if isinstance(module, nn.Embedding) and local == "weight":
        t = torch.empty(shape).normal_(0.0, std, generator=gen)
        if module.padding_idx is not None:
            t[module.padding_idx] = 0.0
        return t
    if isinstance(module, nn.Linear) or kind == "Conv1D":
        if local == "bias":
            return torch.zeros(shape)
        if fam.name == "gpt" and name.endswith(".c_proj.weight"):
            std = std / math.sqrt(2 * config.n_layer)
        return torch.empty(shape).normal_(0.0, std, generator=gen)
    if "LayerNorm" in kind or "RMSNorm" in kind:
        return torch.ones(shape) if local == "weight" else torch.zeros(shape)
    raise ManifestError(f"no initialization rule for parameter {name} of a {kind}: model.family {fam.name!r} "
                        "cannot draw it (give model.weights)")


def hf_names(model: nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> every name it has in `model` (a tied parameter has several, the first one first)."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    return names


def materialize(part: nn.Module, names: dict[int, list[str]], fill: Callable[[list[str], nn.Module, str, nn.Parameter],
                torch.Tensor], device: Any) -> None:
    """Give every meta parameter of `part` storage on `device`, valued `fill(its names, module, local name, meta)`,
    one parameter at a time; a tied parameter stays one tensor.  Real parameters are left alone."""
    device = torch.device(device)
    metas = {id(p): p for p in part.parameters()}  # held, so that no id is reused while the walk runs
    done: dict[int, nn.Parameter] = {}
    for mod in part.modules():
        for local, p in list(mod._parameters.items()):
            if p is None or not p.is_meta:
                continue
            if id(p) not in done:
                value = fill(names[id(p)], mod, local, p)
                done[id(p)] = nn.Parameter(value.to(device), requires_grad=p.requires_grad)
            mod._parameters[local] = done[id(p)]
    del metas
    left = [n for n, t in (*part.named_parameters(), *part.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"{left[0]} has no value after materialization: the family table misses a rule for it")


def _filler(manifest: RunManifest, fam: Family, config: Any,
            reader: WeightsReader | None) -> Callable[[list[str], nn.Module, str, nn.Parameter], torch.Tensor]:
    seed = manifest.train.seed
    if reader is None:
        return lambda names, mod, local, p: init_parameter(fam, config, seed, names[0], mod, local, tuple(p.shape))
    return lambda names, mod, local, p: reader.get(names, tuple(p.shape))


def _lookup_names(skeleton: nn.Module) -> tuple[dict[int, list[str]], set[str]]:
    """Per parameter its names plus those names without the base prefix; and every name a checkpoint may hold."""
    prefix = getattr(skeleton, "base_model_prefix", "")
    names = hf_names(skeleton)
    for ns in names.values():
        ns += [n[len(prefix) + 1:] for n in list(ns) if prefix and n.startswith(prefix + ".")]
    known = {n for ns in names.values() for n in ns}
    for n, _ in skeleton.named_buffers():
        known.add(n)
    return names, known


def build_parts(manifest: RunManifest, wanted: list[tuple[str, int | None]], device: Any = "cpu") -> list[nn.Module]:
    """The modules of the parts `wanted` ((role, stage) pairs), materialized from one skeleton, each holding its own
    parameters (module doc); returned in eval mode, with their parameters' HF names as `hf_param_names`."""
    from .parts import DataPart, RelayPart

    fam = family_of(manifest.model.family)
    skeleton = build_skeleton(manifest)
    names, known = _lookup_names(skeleton)
    reader = open_weights(manifest)
    try:
        if reader is not None:
            reader.check_names(known)
        fill = _filler(manifest, fam, skeleton.config, reader)
        out = []
        for role, stage in wanted:
            if role == "data":
                module: nn.Module = DataPart(fam.name, skeleton)
            else:
                start, end = manifest.stages[stage]
                module = RelayPart(fam.name, skeleton, start, end)
            module.hf_param_names = [names[id(p)][0] for p in module.parameters()]
            materialize(module, names, fill, device)
            module.to(torch.device(device))  # buffers (the rotary inv_freq); parameters are there already
            module.eval()
            out.append(module)
        return out
    finally:
        if reader is not None:
            reader.close()


def build_full_model(manifest: RunManifest) -> "PreTrainedModel":
    """The whole HF model on the CPU, in eval mode, every parameter as the parts draw (or load) it."""
    fam = family_of(manifest.model.family)
    model = build_skeleton(manifest)
    names, known = _lookup_names(model)
    reader = open_weights(manifest)
    if fam.rotary:
        owner_path, _, attr = fam.rotary.rpartition(".")
        owner = get_path(model, owner_path) if owner_path else model
        setattr(owner, attr, fresh_rotary(get_path(model, fam.rotary), model.config))
    try:
        if reader is not None:
            reader.check_names(known)
        materialize(model, names, _filler(manifest, fam, model.config, reader), "cpu")
    finally:
        if reader is not None:
            reader.close()
    model.eval()
    return model
