"""DT-FM's scheduler (sim/schedule/): the cost model on hand-checked cases, the search's invariants, the
pipelines it hands the simulator, and `gwtf-node sim schedule`."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf_node import cli
from gwtf_node.sim.schedule import (
    CostModel, Problem, arrange, bottleneck_matching, flows_of, repin, schedule, search, tsp_path, valid,
)
from gwtf_node.sim.schedule.problems import instance_from_scenario, setting_scenario
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.train import make_setting, run_train


def test_bottleneck_matching_by_hand() -> None:
    # the min-sum assignment (0-0, 1-1, 2-2: sum 1+1+9 = 11) has a bottleneck of 9; the least bottleneck is 5
    w = np.array([[1.0, 5.0, 8.0],
                  [4.0, 1.0, 5.0],
                  [5.0, 7.0, 9.0]])
    t, pairs = bottleneck_matching(w)
    assert t == 5.0
    assert max(w[i, j] for i, j in pairs) == 5.0
    assert sorted(i for i, _ in pairs) == [0, 1, 2] and sorted(j for _, j in pairs) == [0, 1, 2]
    # under 5, row 2 can only take column 0; then row 0 only column 1 (its column 2 is 8): one matching
    assert sorted(pairs) == [(0, 1), (1, 2), (2, 0)]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.randoms(use_true_random=False))
def test_bottleneck_matching_is_the_brute_force_min_max(n: int, rnd: random.Random) -> None:
    w = np.array([[float(rnd.randint(1, 9)) for _ in range(n)] for _ in range(n)])
    best = min(max(w[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
    t, pairs = bottleneck_matching(w)
    assert t == best and max(w[i, j] for i, j in pairs) == best and len(pairs) == n


# four groups A B C D on a line A - B - C - D (weights 1), long edges 10, A-D 3
W4 = np.array([[0.0, 1.0, 10.0, 3.0],
               [1.0, 0.0, 1.0, 10.0],
               [10.0, 1.0, 0.0, 1.0],
               [3.0, 10.0, 1.0, 0.0]])


def test_open_loop_tsp_on_four_groups_by_hand() -> None:
    cost, order = tsp_path(W4)
    assert cost == 3.0 and order == (0, 1, 2, 3)  # A B C D; the reverse ties, the smaller order is kept
    brute = min(sum(W4[p[i], p[i + 1]] for i in range(3)) for p in itertools.permutations(range(4)))
    assert cost == brute


def test_closed_tour_through_the_anchor_on_four_groups_by_hand() -> None:
    # from the data group A back to A: A B C D A = 1 + 1 + 1 + 3 = 6 (A C ... would use a 10)
    cost, order = tsp_path(W4, anchor=0)
    assert cost == 6.0 and order == (0, 1, 2, 3)
    cost2, order2 = tsp_path(W4, anchor=2)  # the same cycle, read from C
    assert cost2 == 6.0 and order2[0] == 2


def _uniform_model(lat_ms: np.ndarray, bw_mbit: np.ndarray, c_pp: float, c_dp: float, anchor=None) -> CostModel:
    return CostModel(lat_ms / 1000.0, bw_mbit / 8.0, c_pp, c_dp, anchor=anchor)


def test_data_parallel_cost_by_hand() -> None:
    # 3 devices; 0-1: 10 ms, 800 Mbit/s (100 MB/s); 0-2 and 1-2: 20 ms, 400 Mbit/s (50 MB/s); c_dp 300 MB
    lat = np.array([[0, 10, 20], [10, 0, 20], [20, 20, 0]], float)
    bw = np.array([[1, 800, 400], [800, 1, 400], [400, 400, 1]], float)
    m = _uniform_model(lat, bw, 1.0, 300.0)
    # device 2: 2 x (0.02 + 300 / (3 x 50)) twice = 2 x 2 x 2.02 = 8.08 s; devices 0, 1: 2(0.01 + 1) + 2(2.02) = 6.06
    assert m.datap_group_s((0, 1, 2)) == pytest.approx(8.08)
    assert m.datap_group_s((0,)) == 0.0


def _two_campuses(n: int) -> CostModel:
    """DT-FM's case 3 (section 4): two organisations, 10 Gbit/s inside, 10 ms and 1.12 Gbit/s across (no
    delay inside is given: 0); the sizes of its reference code for that case: activation 0.28125 GB, gradients
    1 GB."""
    half = n // 2
    lat = np.zeros((n, n))
    bw = np.full((n, n), 10_000.0)
    for i in range(n):
        for j in range(n):
            if (i < half) != (j < half):
                lat[i, j], bw[i, j] = 10.0, 1120.0
    return _uniform_model(lat, bw, 281.25, 1000.0)


def test_the_search_finds_the_hand_derived_optimum_of_dtfm_case_3() -> None:
    """8 devices in 4 stages of 2.  Every group inside one campus (a mixed group's all-reduce costs 7.16 s):
    data parallel 2 (0 + 1000 / (2 x 1250)) = 0.8 s; the pipeline crosses campuses once: two hops inside,
    2 x 281.25 / 1250 = 0.45 s each, one across, 2 (0.01 + 281.25 / 140) = 4.0379 s; total 5.7379 s."""
    m = _two_campuses(8)
    opt = 0.8 + 2 * 0.45 + 2 * (0.01 + 281.25 / 140)
    prob = Problem(tuple(range(8)), (2, 2, 2, 2))
    res = search(m, prob, "dtfm", random.Random(0), population=8, generations=20)
    assert res.costs.total_s == pytest.approx(opt)
    assert all({d < 4 for d in g} in ({True}, {False}) for g in res.partition)
    rnd = search(m, prob, "random", random.Random(0))
    assert rnd.costs.total_s >= opt - 1e-9


@pytest.mark.parametrize("method", ["dtfm", "kl", "random"])
def test_every_candidate_of_the_search_is_a_valid_partition(method: str) -> None:
    rng = np.random.default_rng(3)
    n = 11
    lat = rng.uniform(1, 200, (n, n))
    bw = rng.uniform(50, 2000, (n, n))
    m = CostModel(lat / 1000, bw / 8, 256.0, 152.0, anchor=0)
    prob = Problem(tuple(range(2, n)), (3, 3, 3), (0, 1))  # data group of 2 pinned, 9 relays, sizes 3 3 3
    seen: list = []
    res = search(m, prob, method, random.Random(1), population=6, generations=8, on_candidate=seen.append)
    assert seen and all(valid(prob, p) for p in seen)
    assert valid(prob, res.partition) and res.partition[0] == (0, 1)
    assert res.checked == len(seen)
    if method != "random":
        assert res.history == sorted(res.history, reverse=True)  # the best never gets worse
    assert not valid(prob, ((0, 1), (2, 3, 4), (5, 6, 7), (8, 9, 9)))
    assert not valid(prob, ((0, 2), (1, 3, 4), (5, 6, 7), (8, 9, 10)))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4), st.integers(0, 10**6))
def test_crossover_keeps_every_group_at_its_size(sizes: list[int], seed: int) -> None:
    from gwtf_node.sim.schedule.search import crossover, random_labels
    n = sum(sizes)
    prob = Problem(tuple(range(n)), tuple(sizes))
    rng = random.Random(seed)
    child = crossover(prob, random_labels(prob, rng), random_labels(prob, rng), rng)
    assert valid(prob, prob.partition(child))


def test_the_search_is_determined_by_its_seed() -> None:
    m = _two_campuses(8)
    prob = Problem(tuple(range(8)), (2, 2, 2, 2))
    a = search(m, prob, "dtfm", random.Random(5), population=5, generations=5)
    b = search(m, prob, "dtfm", random.Random(5), population=5, generations=5)
    assert a.partition == b.partition and a.history == b.history


def test_arrange_chains_the_matchings_and_flows_carry_each_data_node_around() -> None:
    s = make_setting("table6-x1", 0)
    inst = instance_from_scenario(parse_scenario(setting_scenario(s)))
    sched = schedule(inst, "dtfm", 0, population=4, generations=3)
    stages = sched.stages()
    assert sorted(r for g in stages for r in g) == sorted(s.relays) and all(len(g) == 3 for g in stages)
    pipes = sched.pipelines()
    assert sorted(d for d, _ in pipes) == ["d0", "d1", "d2"]
    for d, path in pipes:
        assert [next(k for k, g in enumerate(stages) if r in g) for r in path] == [0, 1, 2, 3, 4]
    flows = flows_of(pipes, ["d0", "d1", "d2"], 4)
    for d, path in pipes:
        hops = (d, *path, d)
        assert all(flows[a][d][b] == 4 for a, b in zip(hops, hops[1:]))
    # a stage with 2 live relays: 2 pipelines, their 8 units shared 3 / 3 / 2 among the 3 data nodes
    groups = [list(g) for g in stages]
    groups[2] = groups[2][:2]
    pipes2 = repin(lambda a, b: 1.0, ["d0", "d1", "d2"], groups)
    assert len(pipes2) == 2
    f2 = flows_of(pipes2, ["d0", "d1", "d2"], 4)
    assert sorted(sum(f2[d][d].values()) for d in ("d0", "d1", "d2")) == [2, 3, 3]
    assert repin(lambda a, b: 1.0, ["d0"], [["x"], []]) == []


def test_dtfm_routing_runs_in_the_training_simulator() -> None:
    rep = run_train("table6-x1", "gwtf", 0.0, 2, 0, routing="dtfm", dtfm_options={"generations": 5})
    assert rep["routing"] == "dtfm" and rep["lost_microbatches"] == 0
    assert rep["throughput_per_iteration"] == 12.0 and math.isfinite(rep["time_per_microbatch_s"])
    assert rep["dtfm"]["generations"] == 5 and rep["dtfm"]["recomputations"] == 0


def test_gwtf_flows_over_dtfm_placement() -> None:
    """`placement="dtfm"`: the relays take the stages of DT-FM's search and GWTF's flow machines route over them;
    on Table VI's seed 0 that is within 5 % of DT-FM's own schedule, where the given placement is far behind
    (virtual time: deterministic)."""
    opts = {"generations": 20}
    placed = run_train("table6-x1", "gwtf", 0.0, 3, 0, placement="dtfm", dtfm_options=opts)
    given = run_train("table6-x1", "gwtf", 0.0, 3, 0)
    dtfm = run_train("table6-x1", "gwtf", 0.0, 3, 0, routing="dtfm", dtfm_options=opts)
    assert placed["routing"] == given["routing"] and placed["lost_microbatches"] == 0 and "dtfm" not in placed
    assert placed["throughput_per_iteration"] == 12.0
    assert placed["time_per_microbatch_s"] < 0.5 * given["time_per_microbatch_s"]
    assert placed["time_per_microbatch_s"] <= 1.05 * dtfm["time_per_microbatch_s"], (placed, dtfm)


def test_gwtf_flows_over_its_leaders_whole_swarm_placement() -> None:
    """`placement="swarm"`: every relay where the daemon's leader puts a swarm forming from scratch
    (protocol/swarmplace.py); on Table VI's seed 0 it is within 5 % of DT-FM's whole schedule and less than
    half the given placement's time (virtual time: deterministic)."""
    swarm = run_train("table6-x1", "gwtf", 0.0, 3, 0, placement="swarm")
    given = run_train("table6-x1", "gwtf", 0.0, 3, 0)
    dtfm = run_train("table6-x1", "gwtf", 0.0, 3, 0, routing="dtfm", dtfm_options={"generations": 20})
    assert swarm["lost_microbatches"] == 0 and swarm["throughput_per_iteration"] == 12.0
    assert swarm["time_per_microbatch_s"] < 0.5 * given["time_per_microbatch_s"]
    assert swarm["time_per_microbatch_s"] <= 1.05 * dtfm["time_per_microbatch_s"], (swarm, dtfm)
    with pytest.raises(ValueError, match="unknown placement"):
        run_train("table6-x1", "gwtf", 0.0, 1, 0, placement="nowhere")


def _small_scenario(tmp_path, relays_per_stage: int = 2) -> str:
    nodes = [{"id": f"d{i}", "role": "data", "capacity": 4} for i in range(2)]
    nodes += [{"id": f"r{s}_{i}", "role": "relay", "stage": s, "capacity": 4}
              for s in range(3) for i in range(relays_per_stage)]
    ids = [n["id"] for n in nodes]
    rnd = random.Random(0)
    links = [{"a": a, "b": b, "latency_ms": rnd.randint(1, 100), "bandwidth_mbps": rnd.randint(50, 1000)}
             for i, a in enumerate(ids) for b in ids[i + 1:]]
    p = tmp_path / "sc.json"
    p.write_text(json.dumps({"name": "small", "stages": 3, "nodes": nodes, "links": links}))
    return str(p)


def test_cli_sim_schedule_json_and_text(tmp_path, capsys) -> None:
    sc = _small_scenario(tmp_path)
    assert cli.main(["sim", "schedule", "--scenario", sc, "--method", "dtfm", "--generations", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"] == "small" and out["method"] == "dtfm" and out["generations"] == 4
    assert out["total_cost_s"] == pytest.approx(out["datap_cost_s"] + out["pipelinep_cost_s"])
    assert sorted(r for g in out["stages"] for r in g) == sorted(f"r{s}_{i}" for s in range(3) for i in range(2))
    assert sorted(p["data_node"] for p in out["pipelines"]) == ["d0", "d1"]
    assert cli.main(["sim", "schedule", "--scenario", sc, "--method", "random"]) == 0
    text = capsys.readouterr().out
    assert "method random" in text and "COMM-COST" in text and "stage 2:" in text and "d1:" in text


def test_cli_sim_schedule_says_what_is_wrong_with_unequal_groups(tmp_path, capsys) -> None:
    sc = _small_scenario(tmp_path, relays_per_stage=1)
    assert cli.main(["sim", "schedule", "--scenario", sc]) != 0
    err = capsys.readouterr().err
    assert "3 relays with 2 data node(s) over 3 stages" in err and "give 6 relays" in err
