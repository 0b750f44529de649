"""runtime/node/stage.py: a step and its count move together, and a state installed during an all-reduce is not stepped
twice (its steps already hold the step the round was for)."""

from __future__ import annotations

from pathlib import Path

import torch

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.node.node import Node, NodeOptions


def _stage(tmp_path: Path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    node = Node(NodeOptions(run_path=run, role="relay", stage=0, state_dir=tmp_path / "r0", name="r0",
                            insecure_unsigned=True))
    node.stage.build(0)
    return node.stage


def test_a_step_the_state_already_holds_is_not_applied_again(tmp_path: Path) -> None:
    stage = _stage(tmp_path)
    other = _stage(tmp_path / "b")
    grad = torch.ones(stage.model.num_params)
    assert stage.apply_step(grad, 2, 0) and stage.applied_steps == 1
    # a peer's state after that step arrives while this node's round for iteration 0 ran: installed with its steps
    other.install(stage.model.state_bytes(), stage.applied_steps)
    before = other.model.state_hash()
    assert not other.apply_step(grad, 2, 0)  # (the round's step finishes after the install)
    assert other.applied_steps == 1 and other.model.state_hash() == before == stage.model.state_hash()
    assert other.apply_step(grad, 2, 1) and other.applied_steps == 2 and other.model.state_hash() != before
