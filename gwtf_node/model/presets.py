"""Named model shapes for `init-run --preset`, written as the Hugging Face `config.json` each would have.

Theory of operation
-------------------
A preset is the JSON of a `config.json` and goes through the same mapping as
`init-run --model-config` (`hfconfig.family_config`), so a preset and the
equivalent file give the same manifest.  Every preset has dropout 0 (the
manifest refuses dropout) and no token ids (the byte tokenizer or a trained
`tokenizer.json` has its own).  `tiny` is not a file: it is the byte-level
demo model of `manifest.default_manifest` (hidden 64, two layers per stage).

* `gpt2-small`: GPT-2 small's shape (12 layers, hidden 768, 12 heads, vocab
  50257, 1024 positions, head tied to the embedding): 124.4M parameters.
* `llama-135m`: SmolLM-135M's shape (LLaMA family; 30 layers, hidden 576,
  9 heads with 3 key/value heads, intermediate 1536, vocab 49152, tied):
  134.5M parameters.
* `llama-1b`: Llama-3.2-1B's shape (16 layers, hidden 2048, 32 heads with 8
  key/value heads, intermediate 8192, vocab 128256, tied, RoPE theta 500000,
  no RoPE scaling, 8192 positions): 1.24B parameters.
"""

from __future__ import annotations

from typing import Any

TINY = "tiny"

PRESETS: dict[str, dict[str, Any] | None] = {
    TINY: None,
    "gpt2-small": {
        "model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
        "bos_token_id": None, "eos_token_id": None,
    },
    "llama-135m": {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_act": "silu",
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
        "attention_dropout": 0.0, "initializer_range": 0.02, "bos_token_id": None, "eos_token_id": None,
        "pad_token_id": None,
    },
    "llama-1b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "tie_word_embeddings": True, "attention_dropout": 0.0, "initializer_range": 0.02, "bos_token_id": None,
        "eos_token_id": None, "pad_token_id": None,
    },
}


def preset_config(name: str) -> dict[str, Any] | None:
    """The config.json JSON of preset `name` (None for `tiny`); KeyError for an unknown name."""
    cfg = PRESETS[name]
    return None if cfg is None else dict(cfg)
