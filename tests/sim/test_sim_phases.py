"""The aggregation phase (protocol/phases.py) and the election (protocol/leader.py) in the training simulator.

The leader (one of 3 data nodes, elected in virtual time) crashes before,
while or after it sends BEGIN AGGREGATION, and the first copy of every phase
signal is lost: training goes on, every ledger entry of a closed iteration is
completed or deferred (never twice), no iteration stalls, and the crash costs
the iteration about one election and one membership report, not more.
"""

from __future__ import annotations

import pytest

from gwtf_node.protocol.messages import BeginAggregation, IterationDone
from gwtf_node.protocol.pipeline import MbStatus
from gwtf_node.sim import train as T

ITERS = 4


def check_ledgers(sim: T.TrainSim, rep: dict, survivors) -> None:
    assert rep["unfinished_iterations"] == 0, rep
    assert rep["lost_microbatches"] == 0, rep
    for d in survivors:
        led = sim.nodes[d].rec.ledger
        done = led.completed_everywhere()
        assert len(done) == len(set(done)), "a microbatch was trained twice"
        for it in range(ITERS):
            for seq, st in led.entries[it].items():
                assert st in (MbStatus.COMPLETED, MbStatus.DEFERRED), (d, it, seq, st)
        assert sim.nodes[d].rec.iteration >= ITERS


def leader_of(sim: T.TrainSim) -> str:
    return next(d for d in sim.data if d not in sim.dead and sim._leading(d))


@pytest.mark.parametrize("policy", ["gwtf", "swarm"])
@pytest.mark.parametrize("moment", ["before", "while_to_a_relay", "while_to_a_data_node", "after"])
def test_the_leader_dies_around_begin_aggregation(policy: str, moment: str) -> None:
    """before: when the first report of iteration 1 reaches it; while: its BEGIN of iteration 1 reaches one
    node (a stage-0 relay, or a data node) and no other, then it dies; after: every copy is sent, then it
    dies.  The other two data nodes elect a leader, which completes (or decides again) the BEGIN."""
    s = T.make_setting("table2-homogeneous", 0, data_nodes=3)
    sim = T.TrainSim(s, T.TrainSimOptions(policy=policy, churn=0.0, seed=0))
    state: dict = {}

    def crash(nid: str) -> None:
        state["leader"] = nid
        sim.crash_at(sim.now, nid)

    def observe(nid, event, payload):
        if moment == "before" and "leader" not in state and event == "msg" and sim._leading(nid) \
                and type(payload[1]) is IterationDone and payload[1].iteration == 1:
            crash(nid)

    def drop(sender, to, msg):
        if moment == "before" or type(msg) is not BeginAggregation or msg.iteration != 1:
            return False
        if "leader" not in state and sim._leading(sender):
            crash(sender)
            state["through"] = None
        if sender != state.get("leader"):
            return False
        if moment == "after":
            return False
        wanted = (to in sim.data) == (moment == "while_to_a_data_node")
        if state["through"] is None and wanted:
            state["through"] = to  # this one copy gets through; every other copy from the dying leader is lost
            return False
        return True

    sim.observer, sim.drop = observe, drop
    sim.run(ITERS)
    rep = sim.report(ITERS)
    assert "leader" in state and sim.crashes == [(sim.crashed_at[state["leader"]], state["leader"])]
    survivors = [d for d in sim.data if d != state["leader"]]
    check_ledgers(sim, rep, survivors)
    assert leader_of(sim) in survivors and rep["phases"]["elections"] >= 2
    per = {p["iteration"]: p for p in rep["per_iteration"]}
    normal = max(per[i]["iteration_s"] for i in (0, 2, 3))
    # one election (et_max 4 s + rounds) and one membership report (7 s): far below a minute
    assert per[1]["iteration_s"] < normal + 60.0, (per[1], normal)
    if moment.startswith("while"):
        assert state["through"] is not None


@pytest.mark.parametrize("policy", ["gwtf", "swarm"])
def test_the_first_copy_of_every_phase_signal_is_lost(policy: str) -> None:
    """Every IterationDone, BEGIN AGGREGATION, CAN TAKE and PhaseAck is lost the first time it is sent on a
    link: the resends carry the phase, nothing stalls, nothing is lost."""
    s = T.make_setting("table2-heterogeneous", 1)
    sim = T.TrainSim(s, T.TrainSimOptions(policy=policy, churn=0.1, seed=1))
    seen: set = set()

    def drop(sender, to, msg):
        if type(msg) not in T.PHASE_MSGS:
            return False
        k = (sender, to, type(msg), getattr(msg, "kind", None), msg.iteration)
        if k in seen:
            return False
        seen.add(k)
        return True

    sim.drop = drop
    sim.run(ITERS)
    rep = sim.report(ITERS)
    check_ledgers(sim, rep, sim.data)
    assert rep["phases"]["resent"] > 0 and rep["phases"]["dropped"] > 0
    base = T.run_train("table2-heterogeneous", policy, 0.1, ITERS, 1)
    # each lost copy costs one retransmission deadline (2 s) per hop of the phase
    assert rep["time_per_microbatch_s"] < base["time_per_microbatch_s"] + 60.0


def test_three_data_nodes_keep_the_relays_where_they_were() -> None:
    """A third data node draws its location after the relays: the relays' links are those of 2 data nodes."""
    two, three = T.make_setting("table2-heterogeneous", 4), T.make_setting("table2-heterogeneous", 4, data_nodes=3)
    assert two.relays == three.relays
    assert {n: two.net.loc[n] for n in two.net.loc} == {n: three.net.loc[n] for n in two.net.loc}
    assert three.data == ("d0", "d1", "d2")
