"""The parts a node computes: the data node's embedding and head, a relay's decoder layers.

A part takes its modules out of a family's `*ForCausalLM` (by the paths of
`families.FAMILY_TABLE`): a real model, or the `meta` skeleton that
`materialize.py` builds and then fills with this part's parameters only.

* `DataPart`: token embedding (+ GPT's position embedding), final norm and LM
  head, the tie preserved (a tied LM head is the embedding's tensor);
* `RelayPart`: decoder layers [start, end), plus what they need from the model
  body, recomputed per microbatch from the input's shape: the rotary
  embedding (a fresh module per part, its `inv_freq` computed by the family's
  own rope function on the CPU: the skeleton's buffers are meta) and the mask
  of each layer (`families.mask_kind`: causal, or sliding-window where the
  family's model uses it), from `transformers.masking_utils` as the HF body
  computes them, with the model's attention implementation (sdpa by default).

So the chain DataPart.embed -> RelayPart 0 .. S-1 -> DataPart.head computes
exactly the family's HF model (tested per family).
"""

from __future__ import annotations

import torch
from torch import nn

from .families import family as family_of, get_path, mask_kind


class DataPart(nn.Module):
    """Embedding (+ positions), final norm and LM head of the full model, tie preserved."""

    def __init__(self, family: str, full: nn.Module) -> None:
        super().__init__()
        fam = family_of(family)
        self.embed_tokens = get_path(full, fam.embed)
        self.wpe = get_path(full, fam.positions) if fam.positions else None
        self.norm = get_path(full, fam.norm)
        self.lm_head = get_path(full, fam.head)  # tied: lm_head.weight *is* embed_tokens.weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)  # [B, T] -> [B, T, H]
        if self.wpe is not None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            h = h + self.wpe(positions).unsqueeze(0)
        return h

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))  # [B, T, H] -> [B, T, V]


def fresh_rotary(rotary: nn.Module, config) -> nn.Module:
    """`rotary` itself when its buffers hold values; else a new one of its class, built on the CPU from `config`."""
    if not any(b.is_meta for b in rotary.buffers()):
        return rotary
    with torch.device("cpu"):
        return type(rotary)(config=config)


class RelayPart(nn.Module):
    """Decoder layers [start, end) of the full model, with their own rotary embedding and masks."""

    def __init__(self, family: str, full: nn.Module, start: int, end: int) -> None:
        super().__init__()
        fam = family_of(family)
        self.family = family
        self.layer_call = fam.layer_call
        self.config = full.config
        self.layers = nn.ModuleList(get_path(full, fam.layers)[start:end])
        self.mask_kinds = [mask_kind(family, full.config, i) for i in range(start, end)]
        self.rotary_emb = fresh_rotary(get_path(full, fam.rotary), full.config) if fam.rotary else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)  # [1, T]
        masks = {}
        for kind in sorted(set(self.mask_kinds)):
            fn = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
            # (config, inputs_embeds, attention_mask, cache, position_ids): positional, as the name of the cache
            # argument differs between transformers releases
            masks[kind] = fn(self.config, hidden, None, None, position_ids)
        if self.layer_call == "llama":
            position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)  # (cos, sin)
            for layer, kind in zip(self.layers, self.mask_kinds):
                hidden = layer(hidden, attention_mask=masks[kind], position_embeddings=position_embeddings,
                               position_ids=position_ids)
        else:
            for block, kind in zip(self.layers, self.mask_kinds):
                hidden = block(hidden, None, masks[kind], position_ids=position_ids)
        return hidden
