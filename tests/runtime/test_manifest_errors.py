"""Every mistake in a run manifest gives one line naming the field and what it must be, never a traceback.

Each case edits a valid manifest (written by `init-run`) the way a person editing
run.json by hand might, then starts `gwtf-node join` on it: the command must exit
with status 2 and print one `error:` line that names the field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gwtf_node.cli import main
from gwtf_node.model.manifest import default_manifest

ROOT = Path(__file__).resolve().parents[2]


def _set(path: str, value):
    """An edit of the manifest dict that sets the field at the dotted `path` to `value`."""
    def edit(d: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        d[last] = value
    return edit


CASES = [
    # (edit, what the one-line error must contain)
    (_set("train.betas", 0.9), "train.betas is 0.9"),
    (_set("train.betas", [0.9, "x"]), "train.betas"),
    (_set("stages", "two"), "stages is 'two'"),
    (_set("stages", [[0, 2], 5]), "stages[1] is 5"),
    (_set("stages", [[0, "a"], [2, 4]]), "stages[0] is [0, 'a']"),
    (_set("version", "1"), "version is '1' (a string)"),
    (_set("version", 2), "version 2 is not supported"),
    (_set("model", ["llama"]), "model is a list"),
    (_set("model.config", "small"), "model.config is a string"),
    (_set("model.family", 3), "model.family is 3"),
    (_set("model.weights", 5), "model.weights"),
    (_set("model.colour", "red"), "model has unknown field(s) colour"),
    (_set("data", None), "data is null"),
    (_set("data.source", 5), "data.source is 5"),
    (_set("data.source", [1, 2]), "data.source"),
    (_set("data.seq_len", "64"), "data.seq_len is '64'"),
    (_set("data.tokenizer", ["bytes"]), "data.tokenizer"),
    (_set("train", "adamw"), "train is a string"),
    (_set("train.lr", "fast"), "train.lr is 'fast'"),
    (_set("train.momentun", 0.9), "train has unknown field(s) momentun"),
    (_set("train.optimizer", None), "train.optimizer is None"),
    (_set("train.seed", 1.5), "train.seed is 1.5"),
    (_set("run_name", 7), "run_name"),
    (_set("owner_public_key", 5), "owner_public_key is 5"),
    (_set("signature", [1]), "signature is [1]"),
    (_set("recovery", "wait"), "recovery must be an object"),
    (_set("recovery.empty_stage", "never"), "recovery.empty_stage is 'never'"),
    (lambda d: d.pop("stages"), "missing the field 'stages'"),
    (lambda d: d["data"].pop("seq_len"), "missing the field 'data.seq_len'"),
]


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("edit, needle", CASES, ids=[c[1] for c in CASES])
def test_each_mistake_names_its_field(tmp_path: Path, capsys, edit, needle: str) -> None:
    d = json.loads(default_manifest().to_json())
    if needle.startswith("recovery."):
        d["recovery"] = {"empty_stage": "wait"}
    edit(d)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(d))
    err = _one_line_error(capsys, ["join", "--run", str(run), "--role", "relay", "--state-dir", str(tmp_path / "s")])
    assert needle in err, err
    assert str(run) in err  # which file
    assert "malformed" not in err


@pytest.mark.parametrize("content, needle", [
    (b'{"run_name": "caf\xe9"}', "is not UTF-8 text (byte 0xe9 at offset 17)"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not UTF-8 text"),
    (b"\x00\x01\x02\x03" * 64, "is a binary file"),
    (b"", "not valid JSON"),
    (b"[" * 100000, "nested too deeply"),
    (b"[1, 2]", "must be a JSON object"),
])
def test_unreadable_files_name_the_problem(tmp_path: Path, capsys, content: bytes, needle: str) -> None:
    run = tmp_path / "run.json"
    run.write_bytes(content)
    assert needle in _one_line_error(capsys, ["join", "--run", str(run), "--role", "data",
                                              "--state-dir", str(tmp_path / "s")])


def test_local_reports_the_same_errors(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run.json"
    d = json.loads(default_manifest().to_json())
    d["train"]["betas"] = 0.9
    run.write_text(json.dumps(d))
    assert "train.betas is 0.9" in _one_line_error(capsys, ["local", "--run", str(run), "--workdir", str(tmp_path / "w")])


def test_no_traceback_from_the_installed_command(tmp_path: Path) -> None:
    """The same through a real process: stderr holds the one line and nothing else."""
    run = tmp_path / "run.json"
    run.write_bytes(b'{"version": 1, "run_name": "\xff"}')
    out = subprocess.run([sys.executable, "-m", "gwtf_node.cli", "join", "--run", str(run), "--role", "relay",
                          "--state-dir", str(tmp_path / "s")], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [f"error: manifest {str(run)!r} is not UTF-8 text (byte 0xff at "
                                               "offset 28): give the run.json written by gwtf-node init-run"]


def test_an_owner_without_a_signature_is_refused_before_the_node_starts(tmp_path: Path, capsys) -> None:
    d = json.loads(default_manifest().to_json())
    d["owner_public_key"] = "ab" * 32
    run = tmp_path / "run.json"
    run.write_text(json.dumps(d))
    err = _one_line_error(capsys, ["join", "--run", str(run), "--role", "relay", "--state-dir", str(tmp_path / "s")])
    assert "names an owner but is not signed" in err
    assert not (tmp_path / "s").exists()  # refused before the state directory was made


def test_a_config_value_transformers_refuses_is_one_line(tmp_path: Path) -> None:
    """Found only once the node builds its stage (in the daemon's event loop): still one line, exit 2."""
    d = json.loads(default_manifest().to_json())
    d["model"]["config"]["rope_theta"] = "fast"
    run = tmp_path / "run.json"
    run.write_text(json.dumps(d))
    out = subprocess.run([sys.executable, "-m", "gwtf_node.cli", "join", "--run", str(run), "--role", "relay",
                          "--stage", "0", "--state-dir", str(tmp_path / "s"), "--device", "cpu", "--insecure-unsigned"],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: model.config is not a valid llama config"), last
