"""FusionLLM's OP-Fence (sim/schedule/opfence.py): Louvain clusters, valid placements, the estimator, the geo12
setting, the training simulator's two uses of it and `gwtf-node sim schedule --method opfence`."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import numpy as np
import pytest

from gwtf_node import cli
from gwtf_node.sim.schedule import (
    Plan, clusters, instance_from_setting, opfence, schedule, valid, valid_plan, workload,
)
from gwtf_node.sim.train import GEO12_REGIONS, make_setting, run_train


def _two_groups(weak: float = 10.0) -> np.ndarray:
    """Devices 0-3 and 4-7, every pair inside a group at 1000 MB/s, one 3-4 link of `weak` MB/s, no other."""
    bw = np.zeros((8, 8))
    for g in ((0, 1, 2, 3), (4, 5, 6, 7)):
        for a in g:
            for b in g:
                if a != b:
                    bw[a, b] = 1000.0
    bw[3, 4] = bw[4, 3] = weak
    return bw


@pytest.mark.parametrize("seed", range(5))
def test_louvain_splits_two_dense_groups_at_their_weak_link(seed: int) -> None:
    assert clusters(_two_groups(), seed) == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_louvain_resolution_must_be_positive() -> None:
    with pytest.raises(ValueError, match="resolution"):
        clusters(_two_groups(), 0, resolution=0.0)


def _clustered(rnd: random.Random, n_data: int, stages: int, groups: int) -> tuple[np.ndarray, np.ndarray, tuple,
                                                                                   tuple]:
    """Random devices in `groups` clusters: fast inside (500-2000 MB/s), slow across (5-50 MB/s)."""
    n = n_data * (stages + 1)
    where = [rnd.randrange(groups) for _ in range(n)]
    bw = np.zeros((n, n))
    lat = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            same = where[i] == where[j]
            bw[i, j] = bw[j, i] = rnd.uniform(500, 2000) if same else rnd.uniform(5, 50)
            lat[i, j] = lat[j, i] = rnd.uniform(0.001, 0.005) if same else rnd.uniform(0.03, 0.15)
    return lat, bw, tuple(range(n_data)), tuple(range(n_data, n))


def _check(plan: Plan, data: tuple, relays: tuple, stages: int) -> None:
    assert valid_plan(plan, data, relays, stages) == []
    covered = Counter(r for _, p in plan.pipelines for r in p)
    assert sorted(covered) == sorted(relays) and set(covered.values()) == {1}  # every relay serves once
    assert sorted(d for d, _ in plan.pipelines) == sorted(data)  # every data node has its pipeline
    for s in range(stages):  # every stage served by one relay of every pipeline
        assert sorted(p[s] for _, p in plan.pipelines) == list(plan.stages[s])


@pytest.mark.parametrize("case", range(40))
def test_every_opfence_placement_is_a_valid_partition(case: int) -> None:
    rnd = random.Random(case)
    n_data, stages, groups = rnd.randint(1, 5), rnd.randint(1, 6), rnd.randint(1, 6)
    lat, bw, data, relays = _clustered(rnd, n_data, stages, groups)
    wl = workload(stages, 268.4)
    plan = opfence(lat, bw, data, relays, stages, wl, seed=case)
    _check(plan, data, relays, stages)
    assert all(math.isfinite(t) and t > 0 for t in plan.pipeline_s.values())


def test_placements_of_the_benchmark_settings_are_valid_and_some_pipelines_cross_clusters() -> None:
    crossing = 0
    for name in ("table6-x1", "table6-x2", "geo12-x1", "geo12-x2"):
        for seed in range(3):
            inst = instance_from_setting(make_setting(name, seed))
            sched = schedule(inst, "opfence", seed)
            prob = inst.problem
            assert valid(prob, sched.result.partition)  # DT-FM's validity of the partition as well
            plan = Plan(tuple(tuple(inst.names.index(v) for v in c) for c in sched.extra["clusters"]),
                        {inst.names.index(d): tuple(tuple(r) for r in runs) for d, runs in sched.extra["runs"].items()},
                        sched.arrangement.stages, sched.arrangement.pipelines, {}, 0.0)
            _check(plan, tuple(prob.pinned), tuple(prob.free), len(prob.sizes))
            crossing += sum(len(r) > 1 for r in sched.extra["runs"].values())
    assert crossing > 0  # the greedy cut of a pipeline into runs is exercised, not only whole-cluster pipelines


def test_valid_plan_finds_a_broken_plan() -> None:
    rnd = random.Random(3)
    lat, bw, data, relays = _clustered(rnd, 3, 4, 3)
    plan = opfence(lat, bw, data, relays, 4, workload(4, 100.0), seed=0)
    (d0, p0), (d1, p1) = plan.pipelines[:2]
    swapped = Plan(plan.clusters, plan.runs, plan.stages, ((d0, (p0[1], p0[0]) + p0[2:]),) + plan.pipelines[1:],
                   plan.pipeline_s, 0.0)
    assert valid_plan(swapped, data, relays, 4)
    short = Plan(plan.clusters, {**plan.runs, d0: plan.runs[d0][:-1] + ((plan.runs[d0][-1][0], 0, 0),)},
                 plan.stages, plan.pipelines, plan.pipeline_s, 0.0)
    assert valid_plan(short, data, relays, 4)
    dropped = Plan(plan.clusters, plan.runs, (plan.stages[0][1:],) + plan.stages[1:], plan.pipelines, {}, 0.0)
    assert valid_plan(dropped, data, relays, 4)


def test_a_cluster_with_its_data_node_and_a_relay_per_stage_keeps_the_whole_pipeline() -> None:
    """Two clusters of (data node + 3 relays): each pipeline stays in its own cluster, chained nearest-first."""
    bw = _two_groups(weak=50.0)
    lat = np.where(bw > 0, 0.002, 0.0)
    lat[3, 4] = lat[4, 3] = 0.1
    bw[0, 3] = bw[3, 0] = 900.0  # d0's nearest relay is 3, then 1 (to 3: 1000, ties by index), then 2
    plan = opfence(lat, bw, (0, 4), (1, 2, 3, 5, 6, 7), 3, workload(3, 100.0), seed=1)
    assert plan.runs == {0: ((0, 0, 2),), 4: ((1, 0, 2),)}
    assert dict(plan.pipelines) == {0: (1, 2, 3), 4: (5, 6, 7)}


def test_relays_must_be_stages_times_data_nodes() -> None:
    lat, bw, data, relays = _clustered(random.Random(1), 2, 3, 2)
    with pytest.raises(ValueError, match="give 6"):
        opfence(lat, bw, data, relays[:-1], 3, workload(3, 100.0), seed=0)


def test_the_estimator_by_hand() -> None:
    prof = json.loads((__import__("pathlib").Path(__file__).resolve().parents[2] / "gwtf_node" / "data"
                       / "stage_profile.json").read_text())["ratio_to_relay_forward"]
    wl = workload(2, 100.0, microbatches=3, forward_s=1.0)
    block = (prof["relay_forward"] + prof["relay_backward"]) / 3
    assert wl.stage_s(0) == pytest.approx(3 * block) and wl.stage_s(1) == pytest.approx(3 * block)
    assert wl.data_s() == pytest.approx(prof["data_forward"] + prof["data_final"] + prof["data_loss"])
    assert len(wl.layer_s) == 2 + 2 * 3 and wl.stage_layers == ((1, 2, 3), (4, 5, 6))
    assert wl.cut_s(0.01, 50.0) == pytest.approx(2 * (0.01 + 2.0))
    cuts = [1.0, 10.0, 2.0]  # into stage 0, into stage 1, back into the data node
    comp = [wl.stage_s(0), wl.stage_s(1), wl.data_s()]
    expect = sum(c + r for c, r in zip(comp, cuts)) + 2 * max(max(c, r) for c, r in zip(comp, cuts))
    assert wl.pipeline_s(cuts) == pytest.approx(expect)


def test_geo12_deals_every_region_a_third_of_the_nodes() -> None:
    st = make_setting("geo12-x2", 4)
    region = {loc: r for r, locs in GEO12_REGIONS.items() for loc in locs}
    data_by = Counter(region[st.net.loc[d]] for d in st.data)
    relays_by = Counter(region[st.net.loc[r]] for r in st.relays)
    assert set(data_by.values()) == {2} and set(relays_by.values()) == {10} and len(relays_by) == 3
    assert sorted(st.relays) == sorted(make_setting("table6-x2", 4).relays)
    assert make_setting("geo12-x2", 4).net.loc == st.net.loc  # seeded
    stages_in_region = {r: Counter(st.relays[x][0] for x in st.relays if region[st.net.loc[x]] == r)
                        for r in GEO12_REGIONS}
    assert any(c != Counter({s: 2 for s in range(5)}) for c in stages_in_region.values())  # stages ignore regions


def test_opfence_runs_in_the_training_simulator_both_ways() -> None:
    fixed = run_train("geo12-x1", "gwtf", 0.0, 2, 0, routing="dtfm", dtfm_options={"method": "opfence"})
    assert fixed["lost_microbatches"] == 0 and fixed["throughput_per_iteration"] == 12.0
    assert fixed["dtfm"]["method"] == "opfence" and fixed["dtfm"]["clusters"]
    flows = run_train("geo12-x1", "gwtf", 0.0, 2, 0, placement="opfence", scheduler_cost=True)
    assert flows["lost_microbatches"] == 0 and flows["throughput_per_iteration"] == 12.0
    assert flows["placement_cpu_s"] >= 0.0 and "dtfm" not in flows


def _scenario(tmp_path) -> str:
    nodes = [{"id": f"d{i}", "role": "data", "capacity": 4} for i in range(2)]
    nodes += [{"id": f"r{s}_{i}", "role": "relay", "stage": s, "capacity": 4} for s in range(3) for i in range(2)]
    ids = [n["id"] for n in nodes]
    rnd = random.Random(0)
    links = [{"a": a, "b": b, "latency_ms": rnd.randint(1, 100), "bandwidth_mbps": rnd.randint(50, 1000)}
             for i, a in enumerate(ids) for b in ids[i + 1:]]
    p = tmp_path / "sc.json"
    p.write_text(json.dumps({"name": "small", "stages": 3, "nodes": nodes, "links": links}))
    return str(p)


def test_cli_sim_schedule_opfence_json_and_text(tmp_path, capsys) -> None:
    sc = _scenario(tmp_path)
    assert cli.main(["sim", "schedule", "--scenario", sc, "--method", "opfence", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "opfence" and out["generations"] == 0
    assert sorted(r for g in out["stages"] for r in g) == sorted(f"r{s}_{i}" for s in range(3) for i in range(2))
    assert sorted(v for c in out["clusters"] for v in c) == sorted(["d0", "d1"] + [f"r{s}_{i}" for s in range(3)
                                                                                   for i in range(2)])
    assert sorted(out["runs"]) == ["d0", "d1"] and all(t > 0 for t in out["estimated_pipeline_s"].values())
    assert cli.main(["sim", "schedule", "--scenario", sc, "--method", "opfence", "--resolution", "2"]) == 0
    text = capsys.readouterr().out
    assert "method opfence" in text and "Louvain clusters" in text and "cluster 0:" in text and "d1:" in text


@pytest.mark.parametrize("argv, says", [
    (["--method", "opfence", "--generations", "5"], "--generations set DT-FM's genetic algorithm"),
    (["--method", "opfence", "--population", "5", "--generations", "2"], "--generations and --population"),
    (["--method", "dtfm", "--resolution", "2"], "--resolution is OP-Fence's Louvain resolution"),
    (["--method", "opfence", "--resolution", "0"], "must be a positive finite number"),
    (["--method", "opfence", "--resolution", "x"], "must be a positive number"),
    (["--method", "fence"], "invalid choice"),
])
def test_cli_sim_schedule_bad_flags_give_one_line(tmp_path, capsys, argv, says) -> None:
    sc = _scenario(tmp_path)
    assert cli.main(["sim", "schedule", "--scenario", sc, *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err
