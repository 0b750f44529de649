"""`gwtf-node sim join`: the node-addition experiment (gwtf_node/sim/join/).

Small instances (a few relays, 3 candidates, 3 stages: 27 assignments) keep
the whole file fast and let the optimum be exhaustive, so "optimal is never
beaten" is checked against every assignment.
"""

from __future__ import annotations

import argparse
import itertools
import json

import pytest

from gwtf_node.cli import CliError, build_parser, cmd_sim_join
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim import join
from gwtf_node.sim.join import experiment, policies
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.join import (BATCH_MICROBATCHES, POLICIES, FlowModel, generate_join, policy_capacity_first, policy_gwtf, policy_gwtf_paper,
                                policy_optimal, policy_random, run_join, to_scenario)


def small(setting: int = 1, seed: int = 0, *, relays: int = 9, candidates: int = 3, stages: int = 3):
    return generate_join(setting, seed, relays=relays, candidates=candidates, stages=stages)


def test_instances_follow_table_iv() -> None:
    for setting, (s, per_stage, cap_hi, cost_lo) in {1: (8, 12, 19, 1), 2: (8, 12, 19, 20),
                                                     3: (8, 12, 4, 1), 4: (12, 8, 19, 1)}.items():
        inst = generate_join(setting, 3)
        assert inst.stages == s and len(inst.relay_stage) == 96 and len(inst.candidates) == 20
        assert all(len(inst.stage_members(k)) == per_stage for k in range(s))
        caps = [*inst.relay_cap.values(), *inst.cand_cap.values()]
        assert min(caps) >= 1 and max(caps) <= cap_hi
        assert min(inst.link.values()) >= cost_lo and max(inst.link.values()) <= 99
        for (v, k), intra in inst.cand_intra.items():  # phi + floor U(50, 100)
            phi = max(inst.cost(v, o) for o in inst.neighbours_of_stage(k))
            assert 50 <= intra - phi <= 99
        for r, intra in inst.relay_intra.items():
            phi = max(inst.cost(r, o) for o in inst.neighbours_of_stage(inst.relay_stage[r]) if o != r)
            assert 50 <= intra - phi <= 99
    sizes = {tuple(len(generate_join(5, seed).stage_members(k)) for k in range(8)) for seed in range(4)}
    assert len(sizes) > 1 and all(sum(z) == 96 and min(z) >= 1 for z in sizes)


def test_deterministic_per_seed() -> None:
    assert generate_join(2, 7) == generate_join(2, 7)
    assert generate_join(2, 7).link != generate_join(2, 8).link
    inst = small(seed=4)
    assert run_join(1, 4, instance=inst) == run_join(1, 4, instance=small(seed=4))
    assert policy_random(inst, 1) == policy_random(inst, 1)


def test_evaluation_matches_networkx_optimum() -> None:
    inst = small(setting=2, seed=1, relays=8, candidates=4, stages=3)
    model = FlowModel(inst)
    for assign in [(), (0, 1, 2, 0), (2, 2, 2, 2), policy_gwtf_paper(inst)]:
        ev = model.evaluate(assign)
        ref = optimal_routing(parse_scenario(to_scenario(inst, assign)))
        assert ev.flow == ref.num_flows == min(inst.stage_caps(assign))
        assert ev.total_cost == pytest.approx(ref.total_cost)
        assert ev.cost == pytest.approx(BATCH_MICROBATCHES * ref.total_cost / ref.num_flows ** 2)


def test_policies_respect_stages_and_capacities() -> None:
    inst = generate_join(1, 0, relays=24, candidates=6, stages=4)
    for assign in (policy_gwtf_paper(inst), policy_capacity_first(inst), policy_random(inst, 0), policy_gwtf(inst)):
        assert len(assign) == 6 and all(0 <= s < 4 for s in assign)
        total = sum(inst.stage_caps(assign))
        assert total == sum(inst.relay_cap.values()) + sum(inst.cand_cap.values())
    order = sorted(range(6), key=lambda k: (-inst.cand_cap[inst.candidates[k]], k))
    # The paper's rule (V-B): periods of S candidates, the k-th highest capacity to the k-th most
    # utilized stage (= k-th smallest capacity: every stage carries F), one per stage per period.
    paper, caps = policy_gwtf_paper(inst), inst.stage_caps()
    for start in (0, 4):
        period = order[start:start + 4]
        ranked = sorted(range(4), key=lambda t: (caps[t], t))
        assert [paper[k] for k in period] == ranked[:len(period)]
        for k in period:
            caps[paper[k]] += inst.cand_cap[inst.candidates[k]]
    # The runtime's water-filling: each to the (then) smallest stage.
    caps, wf = inst.stage_caps(), join.policy_waterfill(inst)
    for k in order:
        assert caps[wf[k]] == min(caps)
        caps[wf[k]] += inst.cand_cap[inst.candidates[k]]
    # Highest capacity first, blind to the stages: dealt in stage index order.
    assert [policy_capacity_first(inst)[k] for k in order] == [0, 1, 2, 3, 0, 1]
    # Highest capacity first, blind to utilization: stages kept even in node count.
    cf = policy_capacity_first(inst)
    assert sorted(cf.count(s) for s in range(4)) == [1, 1, 2, 2]


def test_optimal_beats_every_policy_on_exhaustive_instances() -> None:
    for setting, seed in itertools.product((1, 3, 5), range(3)):
        inst = small(setting, seed)
        model = FlowModel(inst)
        opt = policy_optimal(inst, model)
        assert opt.method == "exhaustive"
        best = model.evaluate(opt.assign).cost
        every = [model.evaluate(a).cost for a in itertools.product(range(3), repeat=3)]
        assert best == pytest.approx(min(every))
        for a in (policy_gwtf(inst, model), policy_gwtf_paper(inst), policy_capacity_first(inst),
                  policy_random(inst, seed)):
            assert best <= model.evaluate(a).cost + 1e-9
        assert model.evaluate(policy_gwtf(inst, model)).cost <= model.evaluate(policy_gwtf_paper(inst)).cost


def test_local_search_bound_never_below_the_policies(monkeypatch) -> None:
    monkeypatch.setattr(policies, "EXHAUSTIVE_LIMIT", 0)
    res = run_join(1, 0, instance=generate_join(1, 0, relays=16, candidates=5, stages=4))
    assert res["optimal_method"] == "local-search"
    imp = res["improvement"]
    assert all(imp["optimal"] >= imp[p] - 1e-9 for p in POLICIES)
    assert imp["gwtf"] >= imp["gwtf_paper"] - 1e-9


def _harness() -> argparse.ArgumentParser:
    return build_parser()


def _main(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        args = _harness().parse_args(argv)
        code = args.func(args)
    except CliError as e:  # what cli.main does
        print(f"error: {e}", file=__import__("sys").stderr)
        code = 2
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_output_keys(monkeypatch, capsys) -> None:
    monkeypatch.setattr(experiment, "generate_join", lambda setting, seed: small(setting, seed))
    code, out, err = _main(["sim", "join", "--setting", "2", "--seed", "5", "--json"], capsys)
    # stdout holds the JSON alone; stderr says what runs, each step as it finishes
    lines = err.splitlines()
    assert code == 0 and all(ln.startswith("sim join: ") for ln in lines), err
    assert lines[0].startswith("sim join: setting 2, seed 5: ") and "candidates" in lines[0]
    for step in ("policy gwtf: cost", "policy leader: cost", "policy random: cost", "optimal (exhaustive): cost",
                 "bound on the optimum: cost"):
        assert any(ln.startswith(f"sim join: {step}") for ln in lines), (step, err)
    assert _main(["sim", "join", "--setting", "2", "--seed", "5", "--json", "--quiet"], capsys)[1:] == (out, "")
    res = json.loads(out)
    assert set(res["improvement"]) >= {"gwtf", "capacity_first", "random", "optimal"}
    assert res["setting"] == 2 and res["seed"] == 5 and res["optimal_method"] == "exhaustive"
    code, out, _ = _main(["sim", "join", "--setting", "2", "--seed", "5"], capsys)
    assert code == 0 and "improvement" in out and "optimal" in out


@pytest.mark.parametrize("argv", [
    ["sim", "join"],
    ["sim", "join", "--setting", "6"],
    ["sim", "join", "--setting", "one"],
    ["sim", "join", "--setting", "1", "--seed", "-1"],
    ["sim", "join", "--setting", "1", "--seed", "x"],
    ["sim", "join", "--setting", "1", "--bogus"],
])
def test_bad_flags_exit_2_with_one_line(argv, capsys) -> None:
    code, out, err = _main(argv, capsys)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_cmd_sim_join_is_the_registered_handler() -> None:
    args = _harness().parse_args(["sim", "join", "--setting", "1"])
    assert args.func is cmd_sim_join and args.seed == 0 and args.json is False


def test_capacity_first_is_blind_to_stage_sizes_but_by_size_is_not() -> None:
    inst = generate_join(5, 2, relays=20, candidates=6, stages=4)
    sizes = [len(inst.stage_members(k)) for k in range(4)]
    assert len(set(sizes)) > 1
    order = sorted(range(6), key=lambda k: (-inst.cand_cap[inst.candidates[k]], k))
    assert [policy_capacity_first(inst)[k] for k in order] == [0, 1, 2, 3, 0, 1]
    by_size = join.policy_capacity_first_by_size(inst)
    assert by_size[order[0]] == min(range(4), key=lambda t: (sizes[t], t))


def test_bound_is_below_every_assignment_and_tighter_with_the_bottleneck() -> None:
    """The relaxation is below the min-cost routing of every assignment at its max flow, also
    when the bottleneck stage is imposed; so the bound's cost is below the exhaustive optimum."""
    for setting, seed in itertools.product((1, 3, 5), range(3)):
        inst = small(setting, seed)
        model = FlowModel(inst)
        every = list(itertools.product(range(3), repeat=3))
        for a in every:
            ev = model.evaluate(a)
            caps = inst.stage_caps(a)
            tight = min(model.relaxed_min_cost(ev.flow, s) for s in range(3) if caps[s] == ev.flow)
            assert model.relaxed_min_cost(ev.flow) <= tight + 1e-6 <= ev.total_cost + 2e-6
        bound = join.optimum_bound(inst, model)
        opt = min(model.evaluate(a).cost for a in every)
        assert bound.cost <= opt + 1e-6
        res = run_join(setting, seed, instance=inst)
        assert res["optimal_bound"]["improvement"] >= res["improvement"]["optimal"] - 1e-6
        assert all(res["optimal_bound"]["improvement"] >= v - 1e-6 for v in res["improvement"].values())


def test_bound_is_not_trivial() -> None:
    """The bound is a real constraint: the relaxation cannot carry more than every candidate's
    capacity on top of the weakest stage, and the bound stays below 100 % improvement."""
    inst = generate_join(1, 0, relays=16, candidates=5, stages=4)
    model = FlowModel(inst)
    f_cap = min(inst.stage_caps()) + sum(inst.cand_cap.values())
    assert model.relaxed_min_cost(f_cap + 1) == float("inf")
    res = run_join(1, 0, instance=inst)
    assert 0 < res["optimal_bound"]["improvement"] < 1
    assert res["optimal_bound"]["improvement"] - res["improvement"]["optimal"] < 0.25


def test_milp_optimum_is_the_exhaustive_optimum() -> None:
    for setting, seed in ((1, 0), (3, 1), (5, 2)):
        inst = small(setting, seed)
        model = FlowModel(inst)
        best = min(model.evaluate(a).cost for a in itertools.product(range(3), repeat=3))
        worst = max(itertools.product(range(3), repeat=3), key=lambda a: model.evaluate(a).cost)
        res = join.milp_optimum(inst, model, incumbent=worst, time_limit=30)
        assert res.cost == pytest.approx(best) and res.proven
        assert res.cost_bound <= best + 1e-6
        assert model.evaluate(res.assign).cost == pytest.approx(best)


def test_lp_starts_never_worse_and_rounding_is_an_assignment() -> None:
    inst = generate_join(1, 0, relays=24, candidates=6, stages=4)
    model = FlowModel(inst)
    f = min(inst.stage_caps())
    a = model.relaxed_rounding(f + 2)
    assert a is not None and len(a) == 6 and all(0 <= s < 4 for s in a)
    assert model.relaxed_rounding(f + sum(inst.cand_cap.values()) + 1) is None
    plain, lp = policy_gwtf(inst, model), policy_gwtf(inst, model, lp_starts=True)
    assert model.evaluate(lp).cost <= model.evaluate(plain).cost + 1e-9
