"""A poisoned contribution to a stage's all-reduce is refused by the part owners (protocol/gradguard.py).

The rule on its own (pure), then three real hosts running rounds of the
all-reduce where one member's gradient is scaled by 1e6: every owner leaves it
out, every member ends with the same bits, the mean of the others.
"""

from __future__ import annotations

import pytest
import torch
import trio

from gwtf_node.protocol.gradguard import (HISTORY_ROUNDS, OUTLIER_FACTOR, WARMUP_ROUNDS, Contribution, GradGuard,
                                          rate)

from test_transport import DEADLINE_S, reducing_hosts

SLOT = (0, 100, 300)


def contrib(sender: str, norm: float, count: float = 1.0, length: int = 100) -> Contribution:
    return Contribution(sender, count, norm * norm, length)


def test_rate_is_per_microbatch_and_per_float():
    assert rate(contrib("a", 10.0, count=2.0, length=100)) == pytest.approx(0.5)
    assert rate(contrib("a", 10.0, count=0.0)) == 0.0


def test_after_warm_up_an_outlier_against_the_history_is_refused_and_never_enters_it():
    g = GradGuard()
    for _ in range(WARMUP_ROUNDS):
        assert not g.judge(SLOT, [contrib("a", 1.0), contrib("b", 1.2)], max_count=4).refused
    v = g.judge(SLOT, [contrib("a", 1.0), contrib("b", 1.0e6)], max_count=4)
    assert set(v.refused) == {"b"} and "reference" in v.refused["b"]
    assert max(g.history[SLOT]) < 2 / 10  # (rates: norm / sqrt(100))
    v = g.judge(SLOT, [contrib("a", 1.0), contrib("b", OUTLIER_FACTOR * 0.9)], max_count=4)
    assert not v.refused  # below the factor: an honest spike passes


def test_warm_up_with_two_members_refuses_nothing_by_size_but_three_use_their_median():
    assert not GradGuard().judge(SLOT, [contrib("a", 1.0), contrib("b", 1e6)], max_count=4).refused
    v = GradGuard().judge(SLOT, [contrib("a", 1.0), contrib("b", 1e6), contrib("c", 1.1)], max_count=4)
    assert set(v.refused) == {"b"}


def test_counts_are_bounded_by_the_iterations_microbatches_and_zero_counts_carry_nothing():
    v = GradGuard().judge(SLOT, [contrib("a", 1.0, count=5.0), contrib("b", 0.5, count=0.0),
                                 contrib("c", 0.0, count=0.0)], max_count=4)
    assert set(v.refused) == {"a", "b"}


def test_history_follows_the_slice_and_keeps_the_last_rounds():
    g = GradGuard()
    for i in range(HISTORY_ROUNDS + 5):
        g.judge(SLOT, [contrib("a", 1.0 + i)], max_count=1)
    assert len(g.history[SLOT]) == HISTORY_ROUNDS
    assert not g.judge((0, 50, 300), [contrib("a", 1e6, length=50)], max_count=1).refused  # new slice: warm-up


@pytest.mark.trio
async def test_three_hosts_refuse_a_poisoned_member_and_agree_bit_for_bit(tmp_path):
    with trio.fail_after(DEADLINE_S):
        async with reducing_hosts(tmp_path) as (hs, reducers):
            group = [h.peer_id for h in hs]
            poisoner = sorted(group)[1]
            gen = torch.Generator().manual_seed(0)
            for rnd in range(WARMUP_ROUNDS + 1):
                poisoned = rnd == WARMUP_ROUNDS
                tensors = {p: torch.randn(3001, generator=gen) for p in group}
                if poisoned:
                    tensors[poisoner] = tensors[poisoner] * 1e6
                results = {}

                async def run(h, r):
                    results[h.peer_id] = await r.all_reduce(f"s0/it{rnd}", group, tensors[h.peer_id], 1.0, 10,
                                                            max_count=3)

                async with trio.open_nursery() as nursery:
                    for h, r in zip(hs, reducers):
                        nursery.start_soon(run, h, r)
                kept = [p for p in sorted(group) if not (poisoned and p == poisoner)]
                expected = tensors[kept[0]].clone()
                for p in kept[1:]:
                    expected += tensors[p]
                for pid, (t, c) in results.items():
                    assert torch.equal(t, expected), (rnd, pid)
                    assert c == float(len(kept))
            assert sum(r.outliers_refused for r in reducers) == len(group)  # every owner refused it in its part


# ---- gradient clipping: a manifest setting, applied per part, identically in the reference -------------------


def test_grad_clip_norm_is_a_training_setting_absent_by_default():
    from dataclasses import replace

    from gwtf_node.model.manifest import ManifestError, RunManifest, default_manifest

    base = default_manifest()
    assert "grad_clip_norm" not in base.to_dict()["train"]  # the run id of a manifest without it is unchanged
    clipped = replace(base, train=replace(base.train, grad_clip_norm=0.5))
    back = RunManifest.from_json(clipped.to_json())
    assert back.train.grad_clip_norm == 0.5 and back.run_id == clipped.run_id != base.run_id
    with pytest.raises(ManifestError, match="grad_clip_norm"):
        replace(base, train=replace(base.train, grad_clip_norm=-1.0)).validate(check_files=False)


def test_a_part_clips_its_mean_gradient_before_the_step():
    from dataclasses import replace

    from gwtf_node.model.manifest import default_manifest
    from gwtf_node.model.stages import build_full_model, build_stage

    base = default_manifest()
    clip = 1e-3
    man = replace(base, train=replace(base.train, optimizer="sgd", lr=1.0, grad_clip_norm=clip))
    part = build_stage(man, "relay", 0, full=build_full_model(man))
    before = part.param_vector()
    total = torch.full((part.num_params,), 2.0)
    part.apply_mean_grad(total, 2)
    step = before - part.param_vector()  # SGD, lr 1: the clipped mean gradient
    assert float(step.norm()) == pytest.approx(clip, rel=1e-3)


# ---- a state hand-over is checked against the stage's other members (runtime/node/handover.py) --------------------


def test_the_hash_of_a_handed_over_state_is_the_parameter_hash_of_the_part():
    from gwtf_node.model.manifest import default_manifest
    from gwtf_node.model.stages import build_full_model, build_stage
    from gwtf_node.runtime.node.handover import params_hash

    man = default_manifest()
    part = build_stage(man, "relay", 1, full=build_full_model(man))
    assert params_hash(part.state_bytes()) == part.state_hash()
    with pytest.raises(ValueError, match="not readable"):
        params_hash(b"not a state")


def test_a_state_is_taken_when_the_members_that_vouch_for_it_outnumber_the_others():
    from gwtf_node.runtime.node.handover import verdict

    assert verdict(5, "h", {})[0]  # a stage of one member: the sender's word
    assert verdict(5, "h", {"a": (5, "h")})[0]
    assert not verdict(5, "bad", {"a": (5, "h")})[0]  # one honest member against the sender: refused
    assert not verdict(5, "bad", {"a": (5, "h"), "b": (5, "h")})[0]
    assert verdict(5, "h", {"a": (5, "h"), "b": (5, "forged")})[0]  # one hostile member is outvoted
    ok, why = verdict(5, "h", {"a": (6, "other")})  # a member that stepped meanwhile says nothing either way
    assert ok and "sender's word" in why


def test_an_honest_embedding_spike_is_not_refused() -> None:
    """The rates of the embedding slice (part 0 of 2) of two data nodes, iterations 0-15 of the default model
    (tests/swarm/test_long_exactness.py): at iteration 15 one data node's rate is 1.84, 2,450 times the median of the
    recent accepted ones and 3,500 times the other data node's.  An honest gradient: it is summed."""
    rates = [(0.0115, 0.0127), (0.00481, 0.00687), (0.00296, 0.00202), (0.00155, 0.00478), (0.00104, 0.00118),
             (0.00357, 0.00107), (0.000975, 0.000915), (0.000913, 0.00105), (0.0009, 0.0135), (0.00456, 0.00075),
             (0.000718, 0.000862), (0.000793, 0.000734), (0.00077, 0.000835), (0.00065, 0.00891),
             (0.000499, 0.000596)]
    g = GradGuard()
    for a, b in rates:
        assert not g.judge(SLOT, [contrib("d0", 10 * a), contrib("d1", 10 * b)], max_count=8).refused
    assert not g.judge(SLOT, [contrib("d0", 10 * 0.000526), contrib("d1", 10 * 1.84)], max_count=8).refused
    assert g.judge(SLOT, [contrib("d0", 10 * 0.000526), contrib("d1", 10 * 1.84e3)], max_count=8).refused  # poison
