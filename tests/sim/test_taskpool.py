"""The task pool of the hybrid parameter-server design as a recovery policy of the training simulator
(sim/train/taskpool.py): where its work goes, and its ledger under crashes (nothing lost, nothing counted
twice)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf_node import cli
from gwtf_node.protocol.recovery import RecoveryConfig
from gwtf_node.sim import train as T
from gwtf_node.sim.train.taskpool import TaskPoolNode, TaskPoolSim


def _relay(next_cost: dict[str, float], caps: dict[str, int]) -> TaskPoolNode:
    cfg = RecoveryConfig(node_id="a", stage=0, last_stage=2, capacity=4, data_nodes=("d0",),
                         next_peers=next_cost, prev_peers={"d0": 1.0}, peer_capacity=caps)
    return TaskPoolNode(cfg, random.Random(0))


def test_the_pool_gives_the_task_to_a_free_node_whatever_its_link() -> None:
    node = _relay({"near": 1.0, "far": 500.0}, {"near": 1, "far": 3})
    assert node.routing.choose_next(node, "d0", set()) == "far"  # 3 free slots beat the cheap link with 1
    node.full.add("far")  # it refused (MbDeny): skipped until it offers Room
    assert node.routing.choose_next(node, "d0", set()) == "near"
    assert node.routing.choose_next(node, "d0", {"near"}) is None  # no free node: the task waits in the pool (parks)
    node.dead.add("far")
    node.full.clear()
    assert node.routing.choose_next(node, "d0", set()) == "near"


def test_the_task_pool_trains_every_microbatch_without_churn() -> None:
    rep = T.run_train("table2-heterogeneous", "taskpool", 0.0, 3, 0)
    assert rep["policy"] == "taskpool" and rep["routing"] == "pool"
    assert [p["completed"] for p in rep["per_iteration"]] == [8, 8, 8]
    assert rep["lost_microbatches"] == 0 and rep["flow_messages"] == 0


RELAYS = [f"s{s}r{i}" for s, n in enumerate(T.STAGE_SIZES) for i in range(n)]


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 400.0), st.sampled_from(RELAYS)), max_size=6),
       st.booleans(), st.integers(0, 3))
def test_the_ledger_loses_nothing_and_counts_nothing_twice_under_crashes(plan, rejoin: bool, seed: int) -> None:
    s = T.make_setting("table2-homogeneous", seed)
    sim = TaskPoolSim(s, T.TrainSimOptions(policy="taskpool", churn=0.0, seed=seed, crash_plan=plan, rejoin=rejoin))
    sim.run(3)
    rep = sim.report(3)
    lost, deferred, twice = sim.ledger_check(3)
    assert lost == 0 and twice == 0 and rep["lost_microbatches"] == 0
    assert rep["unfinished_iterations"] == 0, f"replay: TaskPoolSim(make_setting('table2-homogeneous', {seed}), " \
                                              f"TrainSimOptions(policy='taskpool', seed={seed}, crash_plan={plan!r}, " \
                                              f"rejoin={rejoin}))"
    for it in range(3):  # every microbatch of an iteration is completed or deferred, each exactly once
        counts = [sim.nodes[d].rec.ledger.counts(it) for d in s.data]
        assert sum(c["completed"] + c["deferred"] for c in counts) == sum(sum(c.values()) for c in counts)


def test_cli_sim_train_runs_the_task_pool(capsys) -> None:
    assert cli.main(["sim", "train", "--setting", "table2-homogeneous", "--policy", "taskpool", "--iterations", "2",
                     "--churn", "0.1", "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert out["lost_microbatches"] == 0 and out["throughput_per_iteration"] == 8.0
    assert cli.main(["sim", "train", "--policy", "taskpool", "--routing", "oracle", "--iterations", "1"]) != 0
    assert "has no flows" in capsys.readouterr().err


def test_a_node_resyncing_from_a_stage_peer_that_crashes_asks_another_and_the_run_goes_on() -> None:
    """Table II homogeneous, 10 % churn, seed 2: a relay of stage 0 (a relay back from a crash) is left out of
    iteration 16's aggregation and asks the first member of its group for the state after that step; that member
    crashes before it answers.  The node asks another member, as the daemon does (`Joining._fetch_state`'s
    replacement source), and the data nodes, which wait for its CAN TAKE, go on (without it: every iteration from
    16 on unfinished)."""
    sim = TaskPoolSim(T.make_setting("table2-homogeneous", 2), T.TrainSimOptions(policy="taskpool", churn=0.1, seed=2))
    sim.run(17)
    assert sim.resyncs >= 1
    assert all(sim.nodes[d].rec.iteration >= 17 for d in sim.data)
    assert not any(src in sim.dead for (_nid, src) in sim._resync_for)
