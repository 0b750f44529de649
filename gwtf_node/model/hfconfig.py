"""A Hugging Face `config.json` as the manifest's model: family, config dict, parameter counts.

Theory of operation
-------------------
`family_config(raw)` maps the JSON of a decoder's `config.json` to the
manifest's `(family, config)`: `model_type` names the transformers config
class (llama, which SmolLM is, mistral, qwen2, gpt2), the class is built
from the JSON (so transformers' own conversions apply: `rope_theta` and
`rope_scaling` become `rope_parameters`, a missing `head_dim` is derived),
and the config dict keeps exactly the keys that class's constructor takes,
with their values read back from the built config, minus the generic
`PretrainedConfig` keys (label maps, output flags, dtype) and GPT-2's
sequence-summary keys that a causal LM never uses.  Every key is therefore
explicit in the signed manifest, including the defaults the JSON left out:
a GPT-2 config without `resid_pdrop` shows its default 0.1 and the manifest
refuses it, as it refuses any dropout.  Grouped-query attention
(`num_key_value_heads`) and tied embeddings (`tie_word_embeddings`) are
plain keys of the dict and stay as written.

What cannot be built or cut is refused with one `ManifestError` line that
names the key: a `model_type` this project does not cut, a family the
manifest does not know, mixture-of-experts keys, a RoPE type transformers
has no initializer for, heads that do not divide, or a config transformers
rejects.  Keys of the JSON that the class does not take are returned so the
caller can say which were ignored.

`parameter_counts(family, config)` builds the model on torch's meta device
(no memory, no initialisation) and counts its parameters: the whole model,
the data part (embeddings, final norm, head; a tied head once) and each
decoder layer, which is what `memory.py` needs per stage.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from .partition import ManifestError

from .families import FAMILY_TABLE

# HF model_type -> the manifest's family (families.py)
MODEL_TYPES = {f.model_type: f.name for f in FAMILY_TABLE.values()}
# keys that only mixture-of-experts models have (a MoE layer is not a dense decoder layer this project cuts)
MOE_KEYS = ("num_local_experts", "num_experts", "num_experts_per_tok", "n_routed_experts", "n_shared_experts",
            "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step", "moe_layer_freq")
# constructor keys of every config class that say nothing about the model's shape or numerics
_GENERIC = frozenset({"transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
                      "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type"})
# keys of the JSON that are metadata, not ignored model settings
_METADATA = frozenset({"model_type", "torch_dtype", "_name_or_path", "auto_map"})


@dataclass(frozen=True)
class ParamCounts:
    total: int  # the whole model, a tied parameter once
    data: int  # embeddings (+ GPT's positions), final norm and LM head: the data nodes' part
    layers: tuple[int, ...]  # per decoder layer
    data_largest: int = 0  # elements of the data part's largest parameter tensor
    layer_largest: int = 0  # ... and of a decoder layer's

    def stage(self, start: int, end: int) -> int:
        return sum(self.layers[start:end])


def config_class(family: str) -> Any:
    return FAMILY_TABLE[family].classes()[0]


def model_class(family: str) -> Any:
    return FAMILY_TABLE[family].classes()[1]


def _json_value(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_json_value(x) for x in v]
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    return v


def family_config(raw: Any, *, families: tuple[str, ...] | None = None) -> tuple[str, dict[str, Any], list[str]]:
    """(family, config dict, ignored keys) of a `config.json`'s JSON; ManifestError naming the key otherwise."""
    if families is None:
        from .manifest import FAMILIES as families  # noqa: N811 - read when called: families may grow
    if not isinstance(raw, dict):
        raise ManifestError("the model config must be a JSON object (a Hugging Face config.json)")
    mt = raw.get("model_type")
    if mt is None:
        raise ManifestError("the model config has no model_type: give a Hugging Face config.json of a decoder "
                            f"({', '.join(MODEL_TYPES)})")
    if mt not in MODEL_TYPES:
        raise ManifestError(f"model_type {mt!r} is not supported: use a decoder of type {', '.join(MODEL_TYPES)}")
    family = MODEL_TYPES[mt]
    if family not in families:
        raise ManifestError(f"model_type {mt!r} needs the manifest family {family!r}, which this gwtf-node does "
                            f"not build (it builds {', '.join(families)})")
    for key in MOE_KEYS:
        if raw.get(key) not in (None, 0, False):
            raise ManifestError(f"model config key {key} = {raw[key]!r}: mixture-of-experts models are not "
                                "supported (a stage holds dense decoder layers)")
    cls = config_class(family)
    taken = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")]
    # transformers converts these into rope_parameters (5.x); they are read, not ignored
    convertible = {"rope_theta", "rope_scaling", "rope_type", "partial_rotary_factor"}
    ignored = sorted(k for k in raw if k not in taken and k not in _METADATA and k not in convertible)
    kwargs = {k: v for k, v in raw.items() if k in taken or k in convertible}
    _check_activation(raw)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its warnings about the config would be a second line: the checks say it
    try:
        cfg = cls(**kwargs)
    except Exception as e:  # transformers raises ValueError, TypeError, KeyError... for a bad config
        raise ManifestError(f"the model config is not a valid {mt} config: {str(e).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    keep = [k for k in taken if k not in _GENERIC and not k.startswith("summary_")]
    config = {k: _json_value(getattr(cfg, k)) for k in keep if hasattr(cfg, k)}
    _check_rope(config.get("rope_parameters"))
    _check_heads(family, config)
    return family, config, ignored


def _check_activation(raw: dict[str, Any]) -> None:
    from transformers.activations import ACT2FN

    for key in ("hidden_act", "activation_function"):
        if key in raw and raw[key] not in ACT2FN:
            raise ManifestError(f"model config key {key} = {raw[key]!r}: transformers has no such activation")


def _check_rope(rope: Any) -> None:
    if rope is None:
        return
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = rope.get("rope_type", "default") if isinstance(rope, dict) else None
    if kind != "default" and kind not in ROPE_INIT_FUNCTIONS:
        raise ManifestError(f"model config key rope_scaling.rope_type = {kind!r}: transformers builds "
                            f"{', '.join(['default', *ROPE_INIT_FUNCTIONS])} only")


def _check_heads(family: str, config: dict[str, Any]) -> None:
    if family == "gpt":
        return
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and (kv <= 0 or heads % kv):
        raise ManifestError(f"model config key num_key_value_heads = {kv}: it must divide num_attention_heads "
                            f"({heads}) for grouped-query attention")


def build_meta(family: str, config: dict[str, Any]) -> Any:
    """The whole HF model on torch's meta device: shapes only, no memory, no initialisation."""
    import torch

    try:
        cfg = config_class(family)(**config)
        with torch.device("meta"):
            return model_class(family)(cfg)
    except Exception as e:  # a config transformers accepts but cannot build (activation, sizes...)
        raise ManifestError(f"model.config is not a valid {family} config: {str(e).splitlines()[0]}") from None


def parameter_counts(family: str, config: dict[str, Any]) -> ParamCounts:
    """Parameters of the whole model, of the data part and of each decoder layer."""
    import re

    model = build_meta(family, config)
    n_layers = len(model.get_submodule(FAMILY_TABLE[family].layers))
    layer_re = re.compile("^" + re.escape(FAMILY_TABLE[family].layers) + r"\.(\d+)\.")
    layers = [0] * n_layers
    data = data_largest = layer_largest = 0
    for name, p in model.named_parameters():  # a tied parameter once, under its first name
        hit = layer_re.match(name)
        if hit:
            layers[int(hit.group(1))] += p.numel()
            layer_largest = max(layer_largest, p.numel())
        else:
            data += p.numel()
            data_largest = max(data_largest, p.numel())
    return ParamCounts(total=data + sum(layers), data=data, layers=tuple(layers), data_largest=data_largest,
                       layer_largest=layer_largest)
