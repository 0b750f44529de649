"""`train-tokenizer` and `init-run --tokenizer`: a byte-level BPE tokenizer.json trained here, checked against the
model's vocabulary, and a run that trains with it, in a local swarm and centralized, to the same losses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gwtf_node.cli import main
from gwtf_node.model.data import HFTokenizer, bundled_text
from gwtf_node.model.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[2]


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and err.startswith("error: "), err
    return err


@pytest.fixture(scope="module")
def tok512(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    assert main(["train-tokenizer", "--vocab", "512", "--out", str(out)]) == 0
    return out


def test_trained_on_the_bundled_corpus(tok512: Path) -> None:
    tok = HFTokenizer(tok512)
    assert tok.vocab_size == 512
    text = bundled_text()[:20000]
    ids = tok.encode(text)
    assert tok.decode(ids) == text  # byte-level: every text round-trips
    assert len(ids) < 0.6 * len(text.encode())  # the merges compress the corpus it was trained on
    assert tok.decode(tok.encode("naïve — ünïcode ✓")) == "naïve — ünïcode ✓"


def test_trained_on_own_files(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.jsonl"
    a.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    b.write_text("\n".join(json.dumps({"text": f"document number {i} says hello"}) for i in range(50)))
    out = tmp_path / "tok.json"
    assert main(["train-tokenizer", "--data", str(a), str(b), "--vocab", "300", "--out", str(out)]) == 0
    assert "vocabulary 300" in capsys.readouterr().out
    assert HFTokenizer(out).vocab_size == 300


@pytest.mark.parametrize("argv, expect", [
    (["--vocab", "100"], "--vocab 100 is below 257"),
    (["--vocab", "300", "--data", "/no/such.txt"], "not found"),
    (["--vocab", "300", "--data", "corpus.csv"], "--data corpus.csv: give .txt or .jsonl"),
    (["--vocab", "300", "--data", "bundled", "x.txt"], "--data bundled stands alone"),
])
def test_train_tokenizer_errors(tmp_path: Path, capsys, argv: list[str], expect: str) -> None:
    err = _one_line_error(capsys, ["train-tokenizer", "--out", str(tmp_path / "t.json"), *argv])
    assert expect in err, err


def test_tokenizer_larger_than_the_model_vocabulary_is_refused(tmp_path: Path, tok512: Path, capsys) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
                               "num_hidden_layers": 2, "num_attention_heads": 4}))
    err = _one_line_error(capsys, ["init-run", "--out", str(tmp_path / "r.json"), "--model-config", str(cfg),
                                   "--tokenizer", str(tok512)])
    assert "has 512 tokens but the model's vocab_size is 300" in err
    assert not (tmp_path / "r.json").exists()


def test_a_tokenizer_that_is_not_one(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "tok.json"
    bad.write_text("{}")
    assert "cannot load tokenizer" in _one_line_error(capsys, ["init-run", "--out", str(tmp_path / "r.json"),
                                                               "--tokenizer", str(bad)])


def test_the_tiny_model_takes_the_tokenizer_vocabulary(tmp_path: Path, tok512: Path) -> None:
    out = tmp_path / "run.json"
    assert main(["init-run", "--out", str(out), "--tokenizer", str(tok512), "--stages", "1"]) == 0
    man = load_manifest(out)
    assert man.model.config["vocab_size"] == 512 and man.data.tokenizer == str(tok512.resolve())


def _losses(argv: list[str]) -> list[float]:
    out = subprocess.run([sys.executable, "-m", "gwtf_node.cli", "local", *argv, "--json"],
                         capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(ln)["loss"] for ln in out.stdout.splitlines() if ln.startswith("{")]


@pytest.mark.multiprocess
def test_a_run_with_a_trained_tokenizer_trains_as_the_centralized_reference(tmp_path: Path, tok512: Path) -> None:
    """Tiny model, 512-token BPE: 1 data node, 1 stage x 1 relay, 2 iterations; every loss equals --centralized."""
    run = tmp_path / "run.json"
    assert main(["init-run", "--out", str(run), "--tokenizer", str(tok512), "--stages", "1", "--microbatches",
                 "2"]) == 0
    common = ["--run", str(run), "--iterations", "2"]
    swarm = _losses([*common, "--relays-per-stage", "1", "--workdir", str(tmp_path / "w")])
    central = _losses([*common, "--centralized"])
    assert len(swarm) == len(central) == 2
    assert swarm == pytest.approx(central, rel=1e-5)
    assert central[0] == pytest.approx(6.24, abs=0.1)  # ln 512: a fresh model over the 512 tokens
