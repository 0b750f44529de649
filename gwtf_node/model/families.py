"""The model families a run may train, and where each keeps the pieces that the stages cut apart.

Theory of operation
-------------------
A run names its family (`model.family`) and gives the keyword arguments of
that family's Hugging Face config (`model.config`).  Construction
(`materialize.py`) builds the family's `*ForCausalLM` skeleton from them and
takes its pieces by the paths in this table:

    family   model class          embedding (+ positions)  decoder layers  final norm        rotary
    -------  -------------------  -----------------------  --------------  ----------------  ----------------
    llama    LlamaForCausalLM     model.embed_tokens       model.layers    model.norm        model.rotary_emb
    mistral  MistralForCausalLM   model.embed_tokens       model.layers    model.norm        model.rotary_emb
    qwen2    Qwen2ForCausalLM     model.embed_tokens       model.layers    model.norm        model.rotary_emb
    gpt      GPT2LMHeadModel      transformer.wte / .wpe   transformer.h   transformer.ln_f  (none)

and the LM head is `lm_head` in every family (tied to the embedding when the
config says `tie_word_embeddings`, GPT-2's default).  LLaMA, Mistral and Qwen2
share one decoder-layer calling convention (hidden states, mask, rotary cos/sin,
position ids); GPT-2 blocks take (hidden states, past, mask).  The mask of a
layer is the family model's: Mistral applies a sliding-window mask to every
layer when `sliding_window` is set, Qwen2 per `layer_types` (sliding for layers
at or above `max_window_layers` when `use_sliding_window`), LLaMA and GPT-2 the
causal mask (`mask_kind`).  A window at least as long as the sequence equals
the causal mask, a shorter one is applied exactly as the HF model applies it.

`check_config` refuses, with one ManifestError naming the key, what these
classes would build differently from what the config asks (mixture-of-experts
keys, which the dense classes ignore; GPT-2 cross-attention, which a
decoder-only chain never feeds; a `model_type` of another family).  It is pure
(no torch, no transformers): the manifest calls it while validating.

`model_dims` reads the dimensions the daemon needs before it builds anything
(layers, hidden size, heads and key/value heads, vocabulary, positions, whether
the embeddings are tied) from the config dict, with each family's key aliases
and its HF defaults (`_DIM_KEYS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .partition import ManifestError, is_int as _is_int


@dataclass(frozen=True)
class Family:
    name: str
    model_type: str  # the HF config's model_type
    config_class: str  # attribute of `transformers`
    model_class: str
    embed: str  # dotted paths inside the *ForCausalLM module
    positions: str | None  # learned position embedding (GPT-2), or None
    layers: str
    norm: str
    rotary: str | None  # the body's rotary embedding (parameter-free, rebuilt per relay), or None
    head: str
    layer_call: str  # "llama": layer(h, attention_mask=, position_embeddings=, position_ids=); "gpt": block(h, None, mask)
    tie_default: bool  # HF's default of tie_word_embeddings

    def classes(self) -> tuple[type, type]:
        """(config class, model class) from transformers (imported on first use: it takes seconds)."""
        import transformers

        return getattr(transformers, self.config_class), getattr(transformers, self.model_class)


_LLAMA_LIKE = dict(embed="model.embed_tokens", positions=None, layers="model.layers", norm="model.norm",
                   rotary="model.rotary_emb", head="lm_head", layer_call="llama", tie_default=False)

FAMILY_TABLE: dict[str, Family] = {
    "llama": Family("llama", "llama", "LlamaConfig", "LlamaForCausalLM", **_LLAMA_LIKE),
    "mistral": Family("mistral", "mistral", "MistralConfig", "MistralForCausalLM", **_LLAMA_LIKE),
    "qwen2": Family("qwen2", "qwen2", "Qwen2Config", "Qwen2ForCausalLM", **_LLAMA_LIKE),
    "gpt": Family("gpt", "gpt2", "GPT2Config", "GPT2LMHeadModel", embed="transformer.wte", positions="transformer.wpe",
                  layers="transformer.h", norm="transformer.ln_f", rotary=None, head="lm_head", layer_call="gpt",
                  tie_default=True),
}

# config keys of mixture-of-experts variants: the dense classes above accept and ignore them
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
             "shared_expert_intermediate_size", "n_shared_experts")


def family(name: str) -> Family:
    try:
        return FAMILY_TABLE[name]
    except KeyError:
        raise ManifestError(f"model.family is {name!r}; use one of {', '.join(FAMILY_TABLE)}") from None


def check_config(name: str, config: dict[str, Any]) -> None:
    """Raise ManifestError naming the first key of `config` that family `name` cannot build and cut as asked."""
    fam = family(name)
    model_type = config.get("model_type")
    if model_type is not None and model_type != fam.model_type:
        raise ManifestError(f"model.config.model_type is {model_type!r} but model.family {name!r} builds "
                            f"{fam.model_type!r} models: change the family or remove model_type")
    for key in _MOE_KEYS:
        if config.get(key) not in (None, 0, False):
            raise ManifestError(f"model.config.{key} = {config[key]!r}: mixture-of-experts layers are not supported "
                                f"({fam.model_class} builds dense layers); use a dense model")
    if name == "gpt" and config.get("add_cross_attention"):
        raise ManifestError("model.config.add_cross_attention is set: a decoder-only chain has no encoder states "
                            "to attend to; set it to false")
    tie = config.get("tie_word_embeddings", fam.tie_default)
    if not isinstance(tie, bool):
        raise ManifestError(f"model.config.tie_word_embeddings is {tie!r}; give true or false")


def mask_kind(name: str, config: Any, layer_idx: int) -> str:
    """"full_attention" or "sliding_attention": the mask the family's HF model gives decoder layer `layer_idx`."""
    if name == "mistral":
        return "sliding_attention" if getattr(config, "sliding_window", None) is not None else "full_attention"
    if name == "qwen2":
        types = getattr(config, "layer_types", None)
        return types[layer_idx] if types else "full_attention"
    return "full_attention"


def get_path(root: Any, path: str) -> Any:
    """`root.a.b` for path "a.b"."""
    for part in path.split("."):
        root = getattr(root, part)
    return root


# ---- dimensions ----------------------------------------------------------------

# HF config keys per family, with the HF defaults (transformers 5): canonical -> (aliases, default)
_DIM_KEYS: dict[str, dict[str, tuple[tuple[str, ...], int]]] = {
    "llama": {
        "layers": (("num_hidden_layers",), 32),
        "hidden": (("hidden_size",), 4096),
        "heads": (("num_attention_heads",), 32),
        "vocab": (("vocab_size",), 32000),
        "max_positions": (("max_position_embeddings",), 2048),
        "kv_heads": (("num_key_value_heads",), 0),  # 0: HF's default, num_attention_heads
    },
    "mistral": {
        "layers": (("num_hidden_layers",), 32),
        "hidden": (("hidden_size",), 4096),
        "heads": (("num_attention_heads",), 32),
        "vocab": (("vocab_size",), 32000),
        "max_positions": (("max_position_embeddings",), 4096 * 32),
        "kv_heads": (("num_key_value_heads",), 8),
    },
    "qwen2": {
        "layers": (("num_hidden_layers",), 32),
        "hidden": (("hidden_size",), 4096),
        "heads": (("num_attention_heads",), 32),
        "vocab": (("vocab_size",), 151936),
        "max_positions": (("max_position_embeddings",), 32768),
        "kv_heads": (("num_key_value_heads",), 32),
    },
    "gpt": {
        "layers": (("n_layer", "num_hidden_layers"), 12),
        "hidden": (("n_embd", "hidden_size"), 768),
        "heads": (("n_head", "num_attention_heads"), 12),
        "vocab": (("vocab_size",), 50257),
        "max_positions": (("n_positions", "max_position_embeddings"), 1024),
    },
}


@dataclass(frozen=True)
class ModelDims:
    layers: int
    hidden: int
    heads: int
    vocab: int
    max_positions: int
    kv_heads: int = 0  # key/value heads (grouped-query attention); = heads when the family has no such key
    tied: bool = False  # the LM head is the embedding's tensor (tie_word_embeddings)


def model_dims(spec: Any) -> ModelDims:
    """Layers, hidden size, heads, vocabulary and positions from the HF config dict."""
    if spec.family not in _DIM_KEYS:
        raise ManifestError(f"model.family is {spec.family!r}; use one of {', '.join(FAMILY_TABLE)}")
    out: dict[str, Any] = {}
    for canon, (aliases, default) in _DIM_KEYS[spec.family].items():
        value = next((spec.config[a] for a in aliases if a in spec.config), default)
        if canon == "kv_heads" and value in (None, 0):  # HF's default: one key/value head per attention head
            value = out["heads"]
        if not _is_int(value) or value <= 0:
            raise ManifestError(f"model.config.{aliases[0]} is {value!r}; it must be a positive integer")
        out[canon] = value
    out.setdefault("kv_heads", out["heads"])
    tied = spec.config.get("tie_word_embeddings", FAMILY_TABLE[spec.family].tie_default)
    out["tied"] = tied if isinstance(tied, bool) else bool(tied)
    return ModelDims(**out)
