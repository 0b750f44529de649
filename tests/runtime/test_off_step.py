"""A computation on parameters that are not those of its microbatch's iteration is said and counted
(`Microbatches._at_step`, status.json `computed_off_step`)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from gwtf_node.runtime.node.microbatches import Microbatches


def test_a_computation_off_its_iterations_step_is_logged_and_counted(caplog) -> None:
    node = SimpleNamespace(stage=SimpleNamespace(applied_steps=7), off_step=0)
    run = Microbatches._at_step(node, lambda x: x * 2, ("d0", 29, 7), "forward")
    with caplog.at_level(logging.WARNING, logger="gwtf.node"):
        assert run(21) == 42  # on step: computed, nothing said
        assert node.off_step == 0 and not caplog.records
        node.stage.applied_steps = 8  # the step of iteration 7 was applied before this microbatch of 7 ran
        assert run(21) == 42  # still computed: the machine's rules decide what counts
    assert node.off_step == 1
    assert "forward of microbatch 29 of iteration 7 computed on parameters of 8 steps" in caplog.text
