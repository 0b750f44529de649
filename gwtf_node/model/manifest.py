"""The run manifest: what is trained, how it is cut into stages, on what data, with what optimizer.

Theory of operation
-------------------
A run is named by its manifest (DESIGN.md "Roles and the shape of a run").
The owner writes it, signs it with an Ed25519 key, and every node checks the
signature before it joins; the *run id* is a hash of the canonical JSON (sorted
keys, no whitespace, signature left out), so two nodes that agree on the run
id agree on every byte of the model config, the stage cut, the data and the
hyperparameters.  Every node builds its own part of the model only, each
parameter drawn from a generator seeded by `train.seed` and the parameter's
name (`materialize.py`), or read from `model.weights` (`weights.py`, checked
against `model.weights_sha256` when the manifest gives it), so the initial
weights follow from the manifest too and never travel.

Families (`families.py`): llama, mistral, qwen2 (the LLaMA-like decoders:
grouped-query attention via `num_key_value_heads`, tied embeddings via
`tie_word_embeddings`) and gpt (GPT-2).  What a family's classes would build
differently from what its config asks (mixture-of-experts keys, GPT-2
cross-attention) is refused by `families.check_config`, naming the key.

This module is deliberately free of torch and transformers: the daemon reads,
validates and signs manifests at start-up, before it pays the seconds that
importing the torch stack costs.  Model dimensions are therefore read from the
HF config dict with the family's own key aliases and defaults (`model_dims`).

Choices:

* Dropout is refused (every `*dropout` / `*pdrop` key must be 0).  With
  dropout, a stage recomputed after a crash (paper V-D) would draw a different
  mask unless the RNG state travelled with every microbatch; and the
  decentralized == centralized invariant would hold only up to RNG streams.
* File paths (data sources, tokenizer, weights) are kept exactly as written,
  since they are part of the signed bytes; a relative path is resolved against
  the directory of the manifest file it was loaded from (`base_dir`, not
  serialized), else against the working directory.  Relays never open data
  files, so a node that received a manifest over the wire validates it with
  `check_files=False`.
"""

from __future__ import annotations

import hashlib
import json
import enum
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .adatopk import DEFAULT_RATIO, Compression, Gradients
from .manifest_shape import check_shapes, json_type
from .partition import ManifestError, is_int as _is_int, is_number as _is_number, partition_layers  # noqa: F401
from .families import _DIM_KEYS, FAMILY_TABLE, ModelDims, check_config, model_dims  # noqa: F401 (re-exported)
from .precision import check_precision

FAMILIES = tuple(FAMILY_TABLE)  # llama, mistral, qwen2, gpt
OPTIMIZERS = ("adamw", "sgd")
BYTE_VOCAB = 256  # the byte tokenizer's vocabulary
MANIFEST_VERSION = 1  # bumped when the JSON layout changes incompatibly

@dataclass(frozen=True)
class ModelSpec:
    family: str  # llama, mistral, qwen2 (their *ForCausalLM) or gpt (GPT2LMHeadModel): families.FAMILY_TABLE
    config: dict[str, Any]  # kwargs of the family's HF config class (LlamaConfig, ..., GPT2Config)
    # local state dict of the full HF model: .safetensors, a sharded model.safetensors.index.json, or .pt / .bin
    weights: str | None = None
    # sha256 of `weights` (weights.py says what is hashed for a sharded index); None: not checked, and absent
    # from the JSON (the run id of a manifest without it is what it always was)
    weights_sha256: str | None = None


@dataclass(frozen=True)
class DataSpec:
    source: str | list[str]  # "bundled" or local .txt / .jsonl ({"text": ...} per line) files
    tokenizer: str  # "bytes" or a local tokenizers `tokenizer.json`
    seq_len: int  # tokens per sequence (the window read is seq_len + 1: inputs and shifted targets)
    microbatch_size: int  # sequences per microbatch
    microbatches_per_iteration: int  # per data node


@dataclass(frozen=True)
class TrainSpec:
    optimizer: str = "adamw"
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0  # sgd only
    seed: int = 0  # model init and data order
    # Top-K of activations and their gradients on the links (adatopk.py: none | topk | adatopk) and its ratio r;
    # left out of the JSON at their defaults, so that the run id of a manifest without them stays what it was
    compression: str = "none"
    compression_ratio: float = DEFAULT_RATIO
    # how the gradient of a Top-K activation travels back (adatopk.Gradients: aligned | topk); absent at its default
    compression_gradients: str = "aligned"
    # L2 norm to which each part's mean gradient is clipped before the step (a relay stage, or the data nodes'
    # embedding and head: per part, since no node holds the whole model's gradient; the centralized reference
    # clips the same parts the same way).  None: no clipping, and absent from the JSON (the run id of a manifest
    # without it is what it always was).
    grad_clip_norm: float | None = None
    # compute dtype and the dtype of activations/gradients on the links (precision.py); absent at fp32
    precision: str = "fp32"
    wire_dtype: str = "fp32"


class EmptyStage(str, enum.Enum):
    """What a relay does that comes back to a stage with no live member, holding a checkpoint older than the
    stage's state in the run (`runtime/node/resume.py`)."""

    WAIT = "wait"  # wait for a node holding the stage's current state (the default: no training is lost)
    RESTART_FROM_CHECKPOINT = "restart_from_checkpoint"  # resume the stage from that checkpoint: steps are lost


@dataclass(frozen=True)
class RecoverySpec:
    empty_stage: EmptyStage = EmptyStage.WAIT


@dataclass(frozen=True)
class RunManifest:
    run_name: str
    model: ModelSpec
    stages: list[tuple[int, int]]  # [start, end) layer range of each relay stage
    data: DataSpec
    train: TrainSpec
    owner_public_key: str = ""  # hex raw Ed25519 public key; "" for an unsigned run
    signature: str = ""  # hex Ed25519 signature of `signed_bytes()`
    # the owner's choices when a stage loses every member; None: absent from the JSON (so the run id of a
    # manifest without it is what it always was), which means the defaults of RecoverySpec
    recovery: RecoverySpec | None = None
    # any relay may join (True), or relays too are admitted by the owner's certificate (False, absent from the
    # JSON); data nodes always are (certificates.py)
    open_relays: bool = False
    base_dir: str = field(default="", compare=False, repr=False)  # resolves relative paths; not serialized

    # ---- serialization ----------------------------------------------------

    def to_dict(self, *, with_signature: bool = True) -> dict[str, Any]:
        d = asdict(self)
        del d["base_dir"]
        if self.recovery is None:
            del d["recovery"]
        else:
            d["recovery"] = {"empty_stage": self.recovery.empty_stage.value}
        if not self.open_relays:
            del d["open_relays"]
        if self.model.weights_sha256 is None:
            del d["model"]["weights_sha256"]
        d["version"] = MANIFEST_VERSION
        d["stages"] = [list(s) for s in self.stages]
        d["train"]["betas"] = list(self.train.betas)
        if self.train.compression == TrainSpec.compression:  # no compression: absent (the run id does not change)
            del d["train"]["compression"]
            if self.train.compression_ratio == TrainSpec.compression_ratio:
                del d["train"]["compression_ratio"]
        if self.train.compression_gradients == TrainSpec.compression_gradients:
            del d["train"]["compression_gradients"]
        if self.train.grad_clip_norm is None:
            del d["train"]["grad_clip_norm"]
        for name in ("precision", "wire_dtype"):  # fp32: absent (the run id does not change)
            if getattr(self.train, name) == getattr(TrainSpec, name):
                del d["train"][name]
        if not with_signature:
            del d["signature"]
        return d

    def to_json(self, *, indent: int | None = 2) -> str:
        """Stable JSON (sorted keys); `indent=None` gives the compact canonical form."""
        separators = (",", ":") if indent is None else (",", ": ")
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent, separators=separators)

    def signed_bytes(self) -> bytes:
        """The canonical bytes that the signature covers and the run id hashes."""
        d = self.to_dict(with_signature=False)
        return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    @property
    def run_id(self) -> str:
        return hashlib.sha256(self.signed_bytes()).hexdigest()[:16]

    @classmethod
    def from_json(cls, text: str, *, check_files: bool = False, base_dir: str = "") -> "RunManifest":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(f"manifest is not valid JSON: {e}") from None
        except RecursionError:
            raise ManifestError("manifest is not a run manifest: its JSON is nested too deeply") from None
        m = _from_dict(d, base_dir)
        m.validate(check_files=check_files)
        return m

    # ---- derived ------------------------------------------------------------

    @property
    def dims(self) -> ModelDims:
        return model_dims(self.model)

    @property
    def empty_stage(self) -> EmptyStage:
        """What a relay coming back to an empty stage with a stale checkpoint does (RecoverySpec)."""
        return (self.recovery or RecoverySpec()).empty_stage

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def resolve_path(self, p: str) -> Path:
        path = Path(p).expanduser()
        if not path.is_absolute() and self.base_dir:
            path = Path(self.base_dir) / path
        return path

    # ---- validation ---------------------------------------------------------

    def validate(self, *, check_files: bool = True) -> None:
        """Raise ManifestError on the first problem found."""
        if not isinstance(self.run_name, str) or not self.run_name:
            raise ManifestError("run_name must be a non-empty string")
        dims = _check_model(self.model)
        _check_stages(self.stages, dims.layers)
        _check_data(self.data, dims)
        _check_train(self.train)
        t = self.train
        for name in ("owner_public_key", "signature"):
            if not isinstance(getattr(self, name), str):
                raise ManifestError(f"{name} is {getattr(self, name)!r}; it must be a string of hex digits (or absent)")
        if t.grad_clip_norm is not None and (not _is_number(t.grad_clip_norm) or t.grad_clip_norm <= 0):
            raise ManifestError(f"train.grad_clip_norm is {t.grad_clip_norm!r}; give a finite number > 0, or leave "
                                "it out for no clipping")
        if not isinstance(self.open_relays, bool):
            raise ManifestError(f"open_relays is {self.open_relays!r}; give true or false")
        if self.owner_public_key:
            try:
                if len(bytes.fromhex(self.owner_public_key)) != 32:
                    raise ValueError
            except ValueError:
                raise ManifestError("owner_public_key must be 64 hex digits (a raw Ed25519 public key)") from None
        if check_files:
            self.check_files()

    def check_files(self) -> None:
        """The local files this node would open exist (data, tokenizer, weights)."""
        paths = []
        if isinstance(self.data.source, list):
            paths += [("data source", p) for p in self.data.source]
        if self.data.tokenizer != "bytes":
            paths.append(("tokenizer", self.data.tokenizer))
        if self.model.weights:
            paths.append(("model weights", self.model.weights))
        for what, p in paths:
            if not self.resolve_path(p).is_file():
                raise ManifestError(f"{what} file {p!r} not found (resolved to {self.resolve_path(p)})")


def _check_model(m: ModelSpec) -> ModelDims:
    """The model section: family, HF config, weights file and digest, head and layer counts; its dimensions."""
    if m.family not in FAMILIES:
        raise ManifestError(f"model.family is {m.family!r}; use one of {', '.join(FAMILIES)}")
    if not isinstance(m.config, dict):
        raise ManifestError("model.config must be an object of HF config keyword arguments")
    if m.weights is not None and (not isinstance(m.weights, str) or not m.weights):
        raise ManifestError("model.weights must be a file path or null")
    if m.weights_sha256 is not None:
        if not m.weights:
            raise ManifestError("model.weights_sha256 is set but model.weights is not: give both, or neither")
        if not isinstance(m.weights_sha256, str) or len(m.weights_sha256) != 64 or \
                any(c not in "0123456789abcdef" for c in m.weights_sha256):
            raise ManifestError(f"model.weights_sha256 is {m.weights_sha256!r}; give 64 lowercase hex digits "
                                "(the sha256 of the weights file)")
    check_config(m.family, m.config)
    dims = model_dims(m)
    if dims.hidden % dims.heads:
        raise ManifestError(
            f"hidden size {dims.hidden} is not divisible by {dims.heads} attention heads: change one of them"
        )
    if dims.heads % dims.kv_heads:
        raise ManifestError(f"model.config.num_key_value_heads {dims.kv_heads} does not divide the "
                            f"{dims.heads} attention heads: grouped-query attention needs a divisor")
    for key, value in m.config.items():
        if (key.endswith("dropout") or key.endswith("pdrop")) and value not in (0, 0.0, None):
            raise ManifestError(
                f"model.config.{key} = {value}: dropout is not supported (set it to 0.0); "
                "a recomputed stage must reproduce the same activations"
            )
    return dims


def _check_data(dt: DataSpec, dims: ModelDims) -> None:
    """The data section: microbatch shape against the model's positions, tokenizer, sources."""
    for name in ("seq_len", "microbatch_size", "microbatches_per_iteration"):
        v = getattr(dt, name)
        if not _is_int(v) or v <= 0:
            raise ManifestError(f"data.{name} is {v!r}; it must be a positive integer")
    if dt.seq_len > dims.max_positions:
        raise ManifestError(
            f"data.seq_len {dt.seq_len} exceeds the model's {dims.max_positions} positions: "
            "lower seq_len or raise max_position_embeddings / n_positions"
        )
    if not isinstance(dt.tokenizer, str) or not dt.tokenizer:
        raise ManifestError("data.tokenizer must be \"bytes\" or the path of a tokenizer.json")
    if dt.tokenizer == "bytes" and dims.vocab < BYTE_VOCAB:
        raise ManifestError(f"vocab_size {dims.vocab} is below the byte tokenizer's {BYTE_VOCAB}")
    if isinstance(dt.source, str):
        if dt.source != "bundled":
            raise ManifestError(f"data.source is {dt.source!r}; use \"bundled\" or a list of file paths")
    elif isinstance(dt.source, list) and dt.source and all(isinstance(s, str) for s in dt.source):
        for s in dt.source:
            if not (s.endswith(".txt") or s.endswith(".jsonl")):
                raise ManifestError(f"data source {s!r} must be a .txt or .jsonl file")
    else:
        raise ManifestError("data.source must be \"bundled\" or a non-empty list of file paths")


def _check_train(t: TrainSpec) -> None:
    """The train section's optimizer, seed, compression and precision (the clipping norm is checked after the
    signature fields, in `RunManifest.validate`)."""
    if t.optimizer not in OPTIMIZERS:
        raise ManifestError(f"train.optimizer is {t.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    for name in ("lr", "eps", "weight_decay", "momentum"):
        v = getattr(t, name)
        if not _is_number(v) or v < 0 or (name in ("lr", "eps") and v == 0):
            raise ManifestError(f"train.{name} is {v!r}; it must be a finite number > 0 (>= 0 for decay/momentum)")
    if len(t.betas) != 2 or not all(_is_number(b) and 0 <= b < 1 for b in t.betas):
        raise ManifestError(f"train.betas is {t.betas!r}; give two numbers in [0, 1)")
    if not _is_int(t.seed) or t.seed < 0:
        raise ManifestError(f"train.seed is {t.seed!r}; it must be a non-negative integer")
    _check_compression(t)
    check_precision(t.precision, t.wire_dtype, ManifestError)


def _check_stages(stages: Sequence[tuple[int, int]], n_layers: int) -> None:
    if not stages:
        raise ManifestError("stages is empty; give at least one [start, end) layer range")
    expect = 0
    for k, s in enumerate(stages):
        if len(s) != 2 or not all(_is_int(x) for x in s):
            raise ManifestError(f"stages[{k}] is {list(s)!r}; a stage is a [start, end) pair of layer indices")
        start, end = s
        if start != expect:
            raise ManifestError(f"stage {k} starts at layer {start} but must start at {expect}: stages are contiguous")
        if end <= start:
            raise ManifestError(f"stage {k} is [{start}, {end}): it must hold at least one layer")
        expect = end
    if expect != n_layers:
        raise ManifestError(f"stages cover layers 0..{expect} but the model has {n_layers} layers")


def _check_compression(t: TrainSpec) -> None:
    if t.compression not in {c.value for c in Compression}:
        raise ManifestError(f"train.compression is {t.compression!r}; use one of "
                            f"{', '.join(c.value for c in Compression)}")
    if not _is_number(t.compression_ratio) or t.compression_ratio <= 1:
        raise ManifestError(f"train.compression_ratio is {t.compression_ratio!r}; it must be a finite number > 1 "
                            "(a ratio r keeps 1/r of the elements; 10 keeps 10 %)")
    if t.compression_gradients not in {g.value for g in Gradients}:
        raise ManifestError(f"train.compression_gradients is {t.compression_gradients!r}; use one of "
                            f"{', '.join(g.value for g in Gradients)}")


def _check_shapes(d: dict) -> None:
    """Every field has the JSON type the dataclasses are built from (manifest_shape.py)."""
    sections = {"model": (ModelSpec, ("family", "config")),
                "data": (DataSpec, ("source", "tokenizer", "seq_len", "microbatch_size", "microbatches_per_iteration")),
                "train": (TrainSpec, ())}
    check_shapes(d, {name: ({f.name for f in fields(spec)}, req) for name, (spec, req) in sections.items()},
                 default_betas=list(TrainSpec.betas), error=ManifestError)


_TOP_KEYS = {"version", "run_name", "model", "stages", "data", "train", "owner_public_key", "signature", "recovery",
             "open_relays"}


def _recovery(d: Any) -> RecoverySpec | None:
    """The optional `recovery` section: {"empty_stage": "wait" | "restart_from_checkpoint"}."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise ManifestError('recovery must be an object, e.g. {"empty_stage": "wait"}')
    unknown = sorted(set(d) - {"empty_stage"})
    if unknown:
        raise ManifestError(f"recovery has unknown field(s) {', '.join(unknown)}: the only one is empty_stage")
    choice = d.get("empty_stage", EmptyStage.WAIT.value)
    try:
        return RecoverySpec(EmptyStage(choice))
    except ValueError:
        raise ManifestError(f"recovery.empty_stage is {choice!r}; use one of "
                            f"{', '.join(repr(e.value) for e in EmptyStage)}") from None


def _from_dict(d: Any, base_dir: str) -> RunManifest:
    if not isinstance(d, dict):
        raise ManifestError("manifest must be a JSON object")
    unknown = sorted(set(d) - _TOP_KEYS)
    if unknown:
        raise ManifestError(f"manifest has unknown field(s) {', '.join(unknown)}: remove them or upgrade this node")
    version = d.get("version", MANIFEST_VERSION)
    if not _is_int(version):
        raise ManifestError(f"version is {version!r} ({json_type(version)}); it must be the number {MANIFEST_VERSION}")
    if version != MANIFEST_VERSION:
        newer = "a newer gwtf-node wrote it: upgrade this node" if version > MANIFEST_VERSION else "rewrite it"
        raise ManifestError(f"manifest version {version} is not supported: this node reads version "
                            f"{MANIFEST_VERSION} only ({newer})")
    recovery = _recovery(d.get("recovery"))
    _check_shapes(d)
    try:
        model, data, train = d["model"], d["data"], d["train"]
        m = RunManifest(
            run_name=d["run_name"],
            model=ModelSpec(family=model["family"], config=dict(model["config"]), weights=model.get("weights"),
                            weights_sha256=model.get("weights_sha256")),
            stages=[tuple(s) for s in d["stages"]],
            data=DataSpec(
                source=list(data["source"]) if isinstance(data["source"], list) else data["source"],
                tokenizer=data["tokenizer"],
                seq_len=data["seq_len"],
                microbatch_size=data["microbatch_size"],
                microbatches_per_iteration=data["microbatches_per_iteration"],
            ),
            train=TrainSpec(**{**train, "betas": tuple(train.get("betas", TrainSpec.betas))}),
            owner_public_key=d.get("owner_public_key", ""),
            signature=d.get("signature", ""),
            recovery=recovery,
            open_relays=d.get("open_relays", False),
            base_dir=base_dir,
        )
    except KeyError as e:
        raise ManifestError(f"manifest is missing the field {e.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise ManifestError(f"manifest has a malformed section: {e}") from None
    return m


def load_manifest(path: str | Path, *, check_files: bool = True) -> RunManifest:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ManifestError(f"cannot read manifest {str(p)!r}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"manifest {str(p)!r} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}): "
                            "give the run.json written by gwtf-node init-run") from None
    if "\x00" in text:
        raise ManifestError(f"manifest {str(p)!r} is a binary file, not JSON text: "
                            "give the run.json written by gwtf-node init-run")
    try:
        return RunManifest.from_json(text, check_files=check_files, base_dir=str(p.resolve().parent))
    except ManifestError as e:
        raise ManifestError(f"{p}: {e}") from None


def save_manifest(m: RunManifest, path: str | Path) -> None:
    Path(path).write_text(m.to_json() + "\n")


# ---- signing ----------------------------------------------------------------


def public_key_hex(private_key: Ed25519PrivateKey) -> str:
    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def sign_manifest(m: RunManifest, private_key: Ed25519PrivateKey) -> RunManifest:
    """A copy of `m` owned by `private_key`'s holder and signed by it (this changes the run id)."""
    owned = replace(m, owner_public_key=public_key_hex(private_key), signature="")
    return replace(owned, signature=private_key.sign(owned.signed_bytes()).hex())


def require_signed(m: RunManifest, *, insecure_unsigned: bool = False) -> None:
    """Raise ManifestError unless `m` is signed by its owner; an unsigned run passes only when the node was told
    the run is open for testing (`insecure_unsigned`).  A badly signed manifest never passes."""
    verify_manifest(m)
    if not m.owner_public_key and not insecure_unsigned:
        raise ManifestError("manifest is not signed by a run owner: sign it (gwtf-node init-run creates the owner "
                            "key and signs), or pass --insecure-unsigned to join a run open for testing")


def verify_manifest(m: RunManifest) -> None:
    """Raise ManifestError unless `m` is signed by `owner_public_key` (or unsigned with no owner)."""
    if not m.owner_public_key:
        if m.signature:
            raise ManifestError("manifest has a signature but no owner_public_key to check it against")
        return
    if not m.signature:
        raise ManifestError("manifest names an owner but is not signed: sign it with the owner's key")
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(m.owner_public_key))
        key.verify(bytes.fromhex(m.signature), m.signed_bytes())
    except (ValueError, InvalidSignature):
        raise ManifestError(
            "manifest signature does not match its owner's key: it was altered after signing, or signed by another key"
        ) from None


# ---- the demo run -------------------------------------------------------------


def default_manifest(
    *,
    family: str = "llama",
    stages: int = 2,
    layers: int | None = None,
    hidden: int = 64,
    seq_len: int = 64,
    microbatch_size: int = 4,
    microbatches_per_iteration: int = 4,
    lr: float = 3e-3,
    seed: int = 0,
    run_name: str = "demo",
    compression: str = "none",
    compression_ratio: float = DEFAULT_RATIO,
    compression_gradients: str = "aligned",
    config: dict[str, Any] | None = None,
    tokenizer: str = "bytes",
) -> RunManifest:
    """A small byte-level model on the bundled corpus: an iteration takes seconds on a CPU.

    Two layers per stage by default; 4 heads (hidden must be a multiple of 4).
    `config` (an HF config dict of `family`, e.g. from `hfconfig.family_config`)
    replaces that model: `layers` and `hidden` are then the config's.
    """
    if family not in FAMILIES:
        raise ManifestError(f"family is {family!r}; use one of {', '.join(FAMILIES)}")
    n_layers = layers if layers is not None else 2 * stages
    heads = 4
    if config is not None:
        config = dict(config)
        n_layers = model_dims(ModelSpec(family, config)).layers
    elif family != "gpt":  # the LLaMA-like families take the same keys
        config: dict[str, Any] = {
            "vocab_size": BYTE_VOCAB,
            "hidden_size": hidden,
            "intermediate_size": 4 * hidden,
            "num_hidden_layers": n_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "max_position_embeddings": max(seq_len, 64),
            "rms_norm_eps": 1e-5,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        }
    else:
        config = {
            "vocab_size": BYTE_VOCAB,
            "n_embd": hidden,
            "n_layer": n_layers,
            "n_head": heads,
            "n_positions": max(seq_len, 64),
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "bos_token_id": None,
            "eos_token_id": None,
        }
    m = RunManifest(
        run_name=run_name,
        model=ModelSpec(family=family, config=config, weights=None),
        stages=partition_layers(n_layers, stages),
        data=DataSpec(
            source="bundled",
            tokenizer=tokenizer,
            seq_len=seq_len,
            microbatch_size=microbatch_size,
            microbatches_per_iteration=microbatches_per_iteration,
        ),
        train=TrainSpec(optimizer="adamw", lr=lr, seed=seed, compression=compression,
                        compression_ratio=compression_ratio, compression_gradients=compression_gradients),
    )
    m.validate(check_files=False)
    return m
