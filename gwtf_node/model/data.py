"""Training data: tokenizers, the bundled corpus, and deterministic microbatches per data node.

Theory of operation
-------------------
A microbatch is named by (data node, seq): `MicrobatchSource.get(seq)` is a
pure function of (manifest seed, data index, number of data nodes, seq), so a
microbatch that a crash deferred is re-created bit for bit on the next try,
and the centralized reference (`reference.py`) trains on exactly the
microbatches the swarm trains on.

The token stream (the corpus files in order, documents joined by a blank
line, encoded once) is cut into `n_data` contiguous shards; data node i reads
only shard i, so data nodes never train on the same text.  Within a shard,
the windows are the non-overlapping runs of seq_len + 1 tokens starting at
multiples of seq_len (inputs = window[:-1], targets = window[1:]; consecutive
windows share one boundary token, so every token is a target once).  Each
epoch visits the windows in a permutation drawn from a torch generator seeded
by sha256(seed, data index, epoch); a microbatch takes the next
microbatch_size windows of it, and the windows that do not fill a last
microbatch are skipped for that epoch (another permutation includes them
next time).  epoch = seq // microbatches_per_epoch.

The bundled corpus is the English prose of CPython's `pydoc_data.topics`
(about 465 KB, in every CPython install), the values in sorted key order:
a demo needs no download and every node has the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Protocol

import torch

from .manifest import DataSpec, ManifestError, RunManifest


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, nothing to download or train."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_tensor(self, text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()

    def decode(self, ids: Any) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A local `tokenizers` JSON file (a tokenizer.json copied from a model repository, or written by
    `gwtf-node train-tokenizer`: `train_bpe_tokenizer`)."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError:
            raise ManifestError("a tokenizer.json needs the `tokenizers` package: pip install tokenizers") from None
        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as e:  # tokenizers raises its own untyped Exception for a bad file
            raise ManifestError(f"cannot load tokenizer {str(path)!r}: {e}") from None
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Any) -> str:
        return self._tok.decode([int(i) for i in ids])


def load_tokenizer(spec: str, manifest: RunManifest | None = None) -> ByteTokenizer | HFTokenizer:
    """"bytes" or the path of a local tokenizer.json (resolved against the manifest's directory)."""
    if spec == "bytes":
        return ByteTokenizer()
    path = manifest.resolve_path(spec) if manifest is not None else Path(spec)
    if not path.is_file():
        raise ManifestError(f"tokenizer file {spec!r} not found (resolved to {path})")
    return HFTokenizer(path)


MIN_BPE_VOCAB = 257  # a byte-level BPE vocabulary: the 256 bytes and at least one merge


def train_bpe_tokenizer(text: str, vocab_size: int) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` of `vocab_size` tokens trained on `text` (its documents are the
    runs separated by blank lines): GPT-2's pre-tokenization and byte alphabet, no special tokens, so every text
    encodes and `HFTokenizer` decodes it back exactly."""
    from tokenizers import Tokenizer as _Tok, decoders, models, pre_tokenizers, trainers

    tok = _Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator((doc for doc in text.split("\n\n") if doc.strip()), trainer=trainer)
    return tok


def bundled_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def read_texts(paths: list[str], manifest: RunManifest | None = None) -> str:
    """The documents of .txt files (one document each) and .jsonl files ({"text": ...} per line)."""
    docs: list[str] = []
    for p in paths:
        path = manifest.resolve_path(p) if manifest is not None else Path(p)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ManifestError(f"data file {p!r} not found (resolved to {path})") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ManifestError(f"cannot read data file {p!r} as UTF-8 text: {e}") from None
        if p.endswith(".jsonl"):
            for n, line in enumerate(raw.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ManifestError(f"{p} line {n} is not JSON: {e.msg}") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise ManifestError(f"{p} line {n} has no string field \"text\"")
                if obj["text"]:
                    docs.append(obj["text"])
        elif raw.strip():
            docs.append(raw)
        if not raw.strip():
            raise ManifestError(f"data file {p!r} is empty")
    if not docs:
        raise ManifestError(f"the data files {paths} hold no text")
    return "\n\n".join(docs)


def encode_corpus(spec: DataSpec, tokenizer: Any, manifest: RunManifest | None = None) -> torch.Tensor:
    """The whole token stream, int64 [N]."""
    text = bundled_text() if spec.source == "bundled" else read_texts(list(spec.source), manifest)
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode_tensor(text)
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def _derived_seed(*parts: int) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class MicrobatchSource:
    """Deterministic microbatches of data node `data_index` out of `n_data`."""

    def __init__(
        self,
        data_spec: DataSpec,
        tokenizer: Any,
        data_index: int,
        n_data: int,
        seed: int,
        *,
        tokens: torch.Tensor | None = None,
        manifest: RunManifest | None = None,
    ) -> None:
        """`tokens` (the encoded corpus) may be passed to share one encoding among several sources."""
        if not 0 <= data_index < n_data:
            raise ValueError(f"data index {data_index} is not in 0..{n_data - 1}")
        self.spec = data_spec
        self.tokenizer = tokenizer
        self.data_index, self.n_data, self.seed = data_index, n_data, seed
        if tokens is None:
            tokens = encode_corpus(data_spec, tokenizer, manifest)
        vocab = getattr(tokenizer, "vocab_size", None)
        if manifest is not None and vocab is not None and vocab > manifest.dims.vocab:
            raise ManifestError(f"the tokenizer has {vocab} tokens but the model's vocab_size is {manifest.dims.vocab}")
        n = tokens.numel()
        lo, hi = n * data_index // n_data, n * (data_index + 1) // n_data
        self.shard = tokens[lo:hi]
        self.shard_start = lo  # offset of the shard in the token stream (for tests of disjointness)
        T, B = data_spec.seq_len, data_spec.microbatch_size
        self.num_windows = max(0, (self.shard.numel() - 1) // T)
        self.microbatches_per_epoch = self.num_windows // B
        if self.microbatches_per_epoch == 0:
            raise ManifestError(
                f"data shard {data_index} of {n_data} has {self.shard.numel()} tokens: too short for one microbatch "
                f"of {B} x {T + 1} tokens; add data, use fewer data nodes or lower seq_len / microbatch_size"
            )
        self._perm_cache: tuple[int, torch.Tensor] = (-1, torch.empty(0, dtype=torch.long))

    @classmethod
    def for_manifest(cls, manifest: RunManifest, data_index: int, n_data: int) -> "MicrobatchSource":
        tok = load_tokenizer(manifest.data.tokenizer, manifest)
        return cls(manifest.data, tok, data_index, n_data, manifest.train.seed, manifest=manifest)

    def window_starts(self, seq: int) -> torch.Tensor:
        """Offsets in the shard of the microbatch's windows, int64 [B]."""
        if seq < 0:
            raise ValueError(f"microbatch seq must be >= 0, got {seq}")
        epoch, j = divmod(seq, self.microbatches_per_epoch)
        cached_epoch, perm = self._perm_cache  # one tuple: safe to share between threads
        if epoch != cached_epoch:
            g = torch.Generator().manual_seed(_derived_seed(self.seed, self.data_index, self.n_data, epoch))
            perm = torch.randperm(self.num_windows, generator=g)
            self._perm_cache = (epoch, perm)
        B = self.spec.microbatch_size
        return perm[j * B : (j + 1) * B] * self.spec.seq_len

    def get(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, targets), both int64 [B, seq_len]; targets are the inputs shifted by one."""
        T = self.spec.seq_len
        starts = self.window_starts(seq)
        idx = starts.unsqueeze(1) + torch.arange(T + 1).unsqueeze(0)  # [B, T + 1]
        windows = self.shard[idx]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
