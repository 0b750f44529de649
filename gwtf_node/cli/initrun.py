"""The run owner's model commands: `init-run` (write and sign a manifest) and `train-tokenizer`.

`init-run` takes the model one of three ways, exclusive of each other: a
named `--preset` (model/presets.py), a Hugging Face `--model-config`
config.json (model/hfconfig.py), or the tiny demo model's `--family /
--hidden / --layers`; with none of them it writes the tiny demo model.  It
cuts the layers into `--stages`, checks a `--tokenizer` tokenizer.json
against the model's vocabulary (the tiny model's vocabulary is the
tokenizer's), builds the model on torch's meta device
(transformers must be able to build it; no memory is used) and prints its
parameter count.  `train-tokenizer` trains a byte-level BPE tokenizer.json
on the bundled corpus or the given files (model/data.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import CliError, _manifest_error_types, _nonneg_int, _positive_int
from .owner import sign_run


def _millions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def _read_model_config(path: str) -> dict:
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"--model-config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"--model-config {path}: cannot read it as UTF-8 text ({e})") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise CliError(f"--model-config {path} is not JSON: {e}") from None


def model_choice(args: argparse.Namespace) -> tuple[str, dict | None, list[str]]:
    """(family, HF config dict or None for the tiny demo model, keys of the JSON that were ignored)."""
    from ..model.hfconfig import family_config
    from ..model.presets import PRESETS, preset_config

    shape = [f for f, v in (("--family", args.family), ("--hidden", args.hidden), ("--layers", args.layers))
             if v is not None]
    given = (["--preset"] if args.preset else []) + (["--model-config"] if args.model_config else []) + shape[:1]
    if len(given) > 1:
        raise CliError(f"give one of --preset, --model-config or --family/--hidden/--layers, not {' and '.join(given)}")
    if args.preset and args.preset not in PRESETS:
        raise CliError(f"--preset {args.preset!r} is unknown; use one of {', '.join(PRESETS)}")
    raw = preset_config(args.preset) if args.preset else _read_model_config(args.model_config) \
        if args.model_config else None
    if raw is None:
        return args.family or "llama", None, []
    try:
        return family_config(raw)
    except _manifest_error_types() as e:
        where = f"--preset {args.preset}" if args.preset else f"--model-config {args.model_config}"
        raise CliError(f"{where}: {e}") from None


def cmd_init_run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..model.manifest import default_manifest, save_manifest

    family, config, ignored = model_choice(args)
    try:
        man = default_manifest(family=family, stages=args.stages, layers=args.layers, hidden=args.hidden or 64,
                               seq_len=args.seq_len, microbatch_size=args.microbatch_size,
                               microbatches_per_iteration=args.microbatches, lr=args.lr, seed=args.seed,
                               run_name=args.name, compression=args.compression,
                               compression_ratio=args.compression_ratio,
                               compression_gradients=args.compression_gradients, config=config,
                               tokenizer=str(Path(args.tokenizer).resolve()) if args.tokenizer else "bytes")
        if args.tokenizer and config is None:  # the tiny model's embedding is sized to the tokenizer
            from ..model.data import load_tokenizer

            vocab = load_tokenizer(man.data.tokenizer, man).vocab_size
            man = replace(man, model=replace(man.model, config={**man.model.config, "vocab_size": vocab}))
        if args.data:
            man = replace(man, data=replace(man.data, source=[str(Path(f).resolve()) for f in args.data]))
        if args.open_relays:
            man = replace(man, open_relays=True)
        if (args.precision, args.wire_dtype) != ("fp32", "fp32"):
            man = replace(man, train=replace(man.train, precision=args.precision, wire_dtype=args.wire_dtype))
        man.validate(check_files=bool(args.data or args.tokenizer))  # the data and tokenizer files exist
        if args.tokenizer:
            _check_tokenizer(man, args.tokenizer)
        from ..model.hfconfig import parameter_counts

        counts = parameter_counts(man.model.family, man.model.config)  # transformers builds it (meta device)
        man, key_path, created = sign_run(man, args.out, args.owner_key)
        save_manifest(man, args.out)
    except _manifest_error_types() as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot write {args.out}: {e.strerror}") from None
    stages = ", ".join(_millions(counts.stage(s, e)) for s, e in man.stages)
    print(f"wrote {args.out}: run {man.run_id}, {family}, {_millions(counts.total)} parameters "
          f"({counts.total:,}: data part {_millions(counts.data)}, stages {stages}), {len(man.stages)} stages "
          f"{man.stages}, tokenizer {man.data.tokenizer}, signed by the owner key {key_path}"
          f"{' (new: keep it private)' if created else ''}")
    if ignored:
        print(f"ignored config keys the {family} config class does not take: {', '.join(ignored)}")
    return 0


def _check_tokenizer(man, path: str) -> None:
    """The tokenizer loads and its vocabulary fits the model's embedding (ManifestError otherwise)."""
    from ..model.data import load_tokenizer
    from ..model.partition import ManifestError

    tok = load_tokenizer(man.data.tokenizer, man)
    if tok.vocab_size > man.dims.vocab:
        raise ManifestError(f"--tokenizer {path} has {tok.vocab_size} tokens but the model's vocab_size is "
                            f"{man.dims.vocab}: train a smaller vocabulary or raise vocab_size")


def cmd_train_tokenizer(args: argparse.Namespace) -> int:
    from ..model.data import MIN_BPE_VOCAB, bundled_text, read_texts, train_bpe_tokenizer

    if args.vocab < MIN_BPE_VOCAB:
        raise CliError(f"--vocab {args.vocab} is below {MIN_BPE_VOCAB}: a byte-level BPE vocabulary holds the "
                       "256 bytes and at least one merge")
    sources = args.data or ["bundled"]
    if sources == ["bundled"]:
        text = bundled_text()
    else:
        if "bundled" in sources:
            raise CliError("--data bundled stands alone; give it or your own files, not both")
        bad = [f for f in sources if not (f.endswith(".txt") or f.endswith(".jsonl"))]
        if bad:
            raise CliError(f"--data {bad[0]}: give .txt or .jsonl ({{\"text\": ...}} per line) files")
        try:
            text = read_texts(sources)
        except _manifest_error_types() as e:
            raise CliError(f"--data: {e}") from None
    tok = train_bpe_tokenizer(text, args.vocab)
    try:
        tok.save(args.out)
    except Exception as e:  # tokenizers raises its own untyped Exception for an unwritable path
        raise CliError(f"cannot write {args.out}: {e}") from None
    print(f"wrote {args.out}: byte-level BPE, vocabulary {tok.get_vocab_size()}, trained on {len(text):,} "
          f"characters of {'the bundled corpus' if sources == ['bundled'] else ', '.join(sources)}")
    return 0


def add_init_run_parsers(sub) -> None:
    from ..model.presets import PRESETS

    ir = sub.add_parser("init-run", help="write a run manifest with sensible defaults")
    ir.add_argument("--out", required=True, help="where to write the manifest (JSON)")
    ir.add_argument("--name", default="demo", help="run name")
    ir.add_argument("--preset", default=None, metavar="NAME",
                    help=f"a named model shape: {', '.join(PRESETS)} (default: tiny, the demo model)")
    ir.add_argument("--model-config", default=None, metavar="FILE",
                    help="a Hugging Face config.json of a decoder (llama incl. SmolLM, mistral, qwen2, gpt2)")
    ir.add_argument("--family", choices=("llama", "mistral", "qwen2", "gpt"), default=None,
                    help="the tiny model's family (llama)")
    ir.add_argument("--stages", type=_positive_int, default=2, help="relay stages (the layers are cut evenly)")
    ir.add_argument("--layers", type=_positive_int, default=None,
                    help="the tiny model's transformer layers (default 2 per stage)")
    ir.add_argument("--hidden", type=_positive_int, default=None, help="the tiny model's hidden size (64)")
    ir.add_argument("--tokenizer", default=None, metavar="FILE",
                    help="a tokenizers tokenizer.json (gwtf-node train-tokenizer; default: UTF-8 bytes)")
    ir.add_argument("--seq-len", type=_positive_int, default=64)
    ir.add_argument("--microbatch-size", type=_positive_int, default=4)
    ir.add_argument("--microbatches", type=_positive_int, default=4, help="microbatches per data node per iteration")
    ir.add_argument("--lr", type=float, default=3e-3)
    ir.add_argument("--seed", type=_nonneg_int, default=0)
    ir.add_argument("--data", nargs="+", default=None, metavar="FILE",
                    help="your own .txt / .jsonl files (default: the bundled corpus)")
    ir.add_argument("--compression", choices=("none", "topk", "adatopk"), default="none",
                    help="Top-K of activations and gradients on the links: none, topk (every link at the ratio) or "
                         "adatopk (FusionLLM's Eq. 7: only links slower than the fastest)")
    ir.add_argument("--compression-ratio", type=float, default=10.0, metavar="R",
                    help="Top-K keeps 1/R of the elements (adatopk: on the slowest link, R x the encoding overhead)")
    ir.add_argument("--compression-gradients", choices=("aligned", "topk"), default="aligned",
                    help="the gradient of a Top-K activation goes back at that activation's indices (aligned: the "
                         "exact gradient of the sparsified pass) or as its own Top-K (topk: FusionLLM)")
    ir.add_argument("--precision", choices=("fp32", "bf16-mixed"), default="fp32",
                    help="compute: fp32, or bf16-mixed (bfloat16 autocast, float32 weights and optimizer state)")
    ir.add_argument("--wire-dtype", choices=("fp32", "bf16"), default="fp32",
                    help="dtype of activations and their gradients on every link (bf16 halves the bytes)")
    ir.add_argument("--owner-key", default=None, metavar="PATH",
                    help="the owner key that signs the run (default: owner.key beside --out; created if missing)")
    ir.add_argument("--open-relays", action="store_true",
                    help="any relay may join without a certificate (data nodes are always admitted by certificate)")
    ir.set_defaults(func=cmd_init_run)

    tt = sub.add_parser("train-tokenizer", help="train a byte-level BPE tokenizer.json for --tokenizer")
    tt.add_argument("--data", nargs="+", default=None, metavar="FILE",
                    help="'bundled' (the default: the bundled corpus) or your own .txt / .jsonl files")
    tt.add_argument("--vocab", type=_positive_int, required=True, metavar="N", help="vocabulary size")
    tt.add_argument("--out", required=True, help="where to write the tokenizer.json")
    tt.set_defaults(func=cmd_train_tokenizer)
