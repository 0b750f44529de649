"""What a volunteer types wrong gets one line that says what to fix (cli/common.py, cli/status.py,
runtime/checkpoints.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gwtf_node.cli import main


@pytest.mark.parametrize(("argv", "hint"), [
    (["join", "--run", "x", "--role", "relay", "--stagee", "1"], "did you mean --stage?"),
    (["join", "--run", "x", "--role", "relay", "--bootstap", "/ip4/1.2.3.4/tcp/1"], "did you mean --bootstrap?"),
    (["local", "--relay-per-stage", "3"], "did you mean --relays-per-stage?"),
    (["sim", "train", "--iteratons", "3"], "did you mean --iterations?"),
])
def test_a_mistyped_flag_gets_a_suggestion(capsys, argv: list[str], hint: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(hint) and len(err.strip().splitlines()) == 1, err


def test_a_flag_like_nothing_gets_no_suggestion(capsys) -> None:
    assert main(["local", "--zzzzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_status_takes_state_dir_twice(tmp_path: Path, capsys) -> None:
    """`--state-dir a --state-dir b` names both (as `--state-dir a b` does), not only the last."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert main(["status", "--state-dir", str(a), "--state-dir", str(b), "--once"]) == 1
    said = capsys.readouterr()
    assert f"{a}, {b}" in said.out + said.err, said


def test_a_checkpoint_holding_code_is_refused_without_torchs_advice(tmp_path: Path) -> None:
    import torch

    from gwtf_node.runtime.checkpoints import CheckpointError, load

    path = tmp_path / "ckpt.pt"
    torch.save({"format": "x", "what": Path("/")}, path)  # a pickled object, not a tensor or plain value
    with pytest.raises(CheckpointError) as e:
        load(path)
    assert "weights_only" not in str(e.value) and "could run code" in str(e.value)
    assert len(str(e.value).splitlines()) == 1
