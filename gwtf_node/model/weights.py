"""Pretrained weights (`model.weights`): each node reads its own part's tensors, and only those.

Theory of operation
-------------------
`model.weights` names a state dict of the full HF `*ForCausalLM` model, in one
of three forms:

* a `.safetensors` file;
* a sharded safetensors checkpoint, named by its index
  (`model.safetensors.index.json`: `{"weight_map": {tensor name: shard file}}`,
  shard paths relative to the index);
* a `.pt` / `.bin` torch state dict.  torch.load reads the *whole* file into
  memory on every node: use safetensors for anything large.

For safetensors, `WeightsReader.get` opens the file holding a tensor with
`safetensors.safe_open` (a memory map) and reads that tensor only: a relay
touches the bytes of its own layers, the data node those of the embedding,
final norm and head.  Before any tensor is read, the reader checks what the
file promises: every tensor name it holds belongs to the model (a file of
another config is refused at once, not after some parts loaded), and each
tensor's shape is read from the header and compared with the parameter's.
Every mismatch (an unreadable file, a missing tensor, a wrong shape, a bad
hash) is one ManifestError naming the key.

Names.  A tensor is looked up by every name of its parameter (a tied LM head
may be stored under `lm_head.weight` or under the embedding's name) and by
those names without the model's base prefix (`transformer.` / `model.`): the
public GPT-2 checkpoints store `h.0.attn.c_attn.weight`.  Legacy buffers that
old checkpoints carry (GPT-2's `attn.bias` / `attn.masked_bias` masks, a
rotary `inv_freq`) are ignored: the parts recompute them.  Tensors of any
floating dtype are converted to float32 (the parameters' dtype).

The hash.  `model.weights_sha256` (optional) is the sha256 of the file; for a
sharded index, of the index file's bytes followed by the bytes of each shard it
names, in sorted order of shard file name (`cat index $(shards sorted) |
sha256sum`).  So one string covers every byte a node might read, but every
node hashes every shard (streamed through sha256 in 1 MiB chunks: constant
memory, the whole checkpoint's disk reads).  A digest is computed once per
process for a given (path, size, mtime) and reused by every part built there.
`weights_digest` computes it for the run owner.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import safe_open

from .partition import ManifestError

INDEX_SUFFIX = ".index.json"
_LEGACY_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
_DIGESTS: dict[tuple, str] = {}
_DIGEST_LOCK = threading.Lock()


def _index_shards(path: Path) -> dict[str, str]:
    """weight_map of a sharded index: tensor name -> shard file name."""
    try:
        index = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"model.weights index {str(path)!r} is not readable JSON: {e}") from None
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise ManifestError(f"model.weights index {str(path)!r} has no \"weight_map\" of tensor name -> shard file")
    for shard in set(wm.values()):
        if Path(shard).is_absolute() or ".." in Path(shard).parts:
            raise ManifestError(f"model.weights index {str(path)!r} names shard {shard!r} outside its directory")
    return wm


def _files_hashed(path: Path) -> list[Path]:
    if path.name.endswith(INDEX_SUFFIX):
        return [path] + [path.parent / s for s in sorted(set(_index_shards(path).values()))]
    return [path]


def weights_digest(path: str | Path) -> str:
    """sha256 of a weights file, or of a sharded index and its shards (module doc); cached per process."""
    path = Path(path)
    files = _files_hashed(path)
    try:
        key = tuple((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    except OSError as e:
        raise ManifestError(f"cannot read model weights {e.filename!r}: {e.strerror}") from None
    with _DIGEST_LOCK:
        if key in _DIGESTS:
            return _DIGESTS[key]
    h = hashlib.sha256()
    for f in files:
        try:
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
        except OSError as e:
            raise ManifestError(f"cannot read model weights {str(f)!r}: {e.strerror}") from None
    digest = h.hexdigest()
    with _DIGEST_LOCK:
        _DIGESTS[key] = digest
    return digest


class WeightsReader:
    """The tensors of one weights file (or sharded index), read one by one (module doc)."""

    def __init__(self, path: str | Path, sha256: str | None = None) -> None:
        self.path = Path(path)
        self.where: dict[str, Path] = {}  # tensor name -> file (safetensors)
        self._loaded: dict[str, torch.Tensor] | None = None  # a .pt / .bin state dict, read whole
        self._open: dict[Path, Any] = {}
        if not self.path.is_file():
            raise ManifestError(f"model weights file {str(self.path)!r} not found")
        if sha256 is not None:
            actual = weights_digest(self.path)
            if actual != sha256:
                raise ManifestError(f"model weights {str(self.path)!r} have sha256 {actual}, but model.weights_sha256 "
                                    f"is {sha256}: the file changed, or the manifest names another file")
        name = self.path.name
        if name.endswith(INDEX_SUFFIX):
            self.where = {k: self.path.parent / v for k, v in _index_shards(self.path).items()}
            for f in set(self.where.values()):
                if not f.is_file():
                    raise ManifestError(f"model weights shard {str(f)!r} named by {str(self.path)!r} not found")
        elif name.endswith(".safetensors"):
            self.where = {k: self.path for k in self._file(self.path).keys()}
        else:
            try:
                sd = torch.load(self.path, map_location="cpu", weights_only=True)
            except Exception as e:  # torch raises several unrelated types for a file it cannot read
                raise ManifestError(f"cannot load model weights from {str(self.path)!r}: {e}") from None
            if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
                raise ManifestError(f"model weights {str(self.path)!r} do not hold a state dict")
            self._loaded = sd

    def _file(self, f: Path) -> Any:
        if f not in self._open:
            try:
                self._open[f] = safe_open(str(f), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error types for a bad header
                raise ManifestError(f"cannot read model weights {str(f)!r}: {e}") from None
        return self._open[f]

    def keys(self) -> list[str]:
        return list(self._loaded) if self._loaded is not None else list(self.where)

    def check_names(self, known: Iterable[str]) -> None:
        """Refuse a file holding a tensor the model does not have (another config's checkpoint)."""
        known = set(known)
        unexpected = [k for k in self.keys() if k not in known and not k.endswith(_LEGACY_BUFFER_SUFFIXES)]
        if unexpected:
            raise ManifestError(f"model weights {str(self.path)!r} do not match model.config: unexpected tensor "
                                f"{unexpected[0]!r}" + (f" and {len(unexpected) - 1} more" if len(unexpected) > 1 else ""))

    def find(self, names: list[str]) -> str | None:
        """The first of `names` the file holds."""
        keys = self._loaded if self._loaded is not None else self.where
        return next((n for n in names if n in keys), None)

    def get(self, names: list[str], shape: tuple[int, ...]) -> torch.Tensor:
        """The tensor stored under one of `names`, checked against `shape`, as float32 on the CPU."""
        key = self.find(names)
        if key is None:
            raise ManifestError(f"model weights {str(self.path)!r} do not match model.config: missing tensor "
                                f"{names[0]!r}")
        if self._loaded is not None:
            t = self._loaded[key]
            stored = tuple(t.shape)
        else:
            try:
                f = self._file(self.where[key])
                stored = tuple(f.get_slice(key).get_shape())
            except ManifestError:
                raise
            except Exception as e:
                raise ManifestError(f"cannot read tensor {key!r} of model weights {str(self.where[key])!r}: {e}") from None
        if stored != tuple(shape):
            raise ManifestError(f"model weights {str(self.path)!r} do not match model.config: tensor {key!r} has shape "
                                f"{list(stored)}, the model's is {list(shape)}")
        if self._loaded is None:
            try:
                t = f.get_tensor(key)
            except Exception as e:
                raise ManifestError(f"cannot read tensor {key!r} of model weights {str(self.where[key])!r}: {e}") from None
        if not t.is_floating_point():
            raise ManifestError(f"model weights {str(self.path)!r}: tensor {key!r} is {t.dtype}, not floating point")
        return t.to(torch.float32)

    def close(self) -> None:
        self._open.clear()
        self._loaded = None


def open_weights(manifest: Any) -> WeightsReader | None:
    """The reader of `manifest.model.weights` (hash checked), or None for a run initialised from its seed."""
    if not manifest.model.weights:
        return None
    return WeightsReader(manifest.resolve_path(manifest.model.weights), getattr(manifest.model, "weights_sha256", None))
