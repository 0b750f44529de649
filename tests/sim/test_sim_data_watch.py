"""A data node's crash in the training simulator: the relays of the first and last stages learn of it DETECT_S
after it, those of the middle stages MIDDLE_DATA_DETECT_S after it, as the daemon's liveness check gives a data
node watched by a middle relay the loose deadline (runtime/node/liveness.py)."""

from __future__ import annotations

import pytest

from gwtf_node.runtime.node import liveness
from gwtf_node.sim import train as T
from gwtf_node.sim.train.setting import MIDDLE_DATA_DETECT_S


def test_middle_data_detect_s_is_the_daemons_loose_deadline() -> None:
    assert MIDDLE_DATA_DETECT_S == liveness.LOOSE_DEAD_AFTER_S + liveness.PING_EVERY_S
    assert T.TrainSimOptions().middle_data_detect_s == MIDDLE_DATA_DETECT_S


@pytest.mark.parametrize("late_s", [MIDDLE_DATA_DETECT_S, T.DETECT_S])
def test_the_relays_of_middle_stages_learn_of_a_data_nodes_crash_later(late_s: float) -> None:
    s = T.make_setting("table2-homogeneous", 0, data_nodes=3)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0, middle_data_detect_s=late_s))
    told: dict[str, float] = {}
    real = {n: sim.nodes[n].rec.peer_gone for n in sim.nodes}
    for n in sim.nodes:
        def peer_gone(now, gone, _n=n):
            if gone == "d2":
                told[_n] = now
            return real[_n](now, gone)
        sim.nodes[n].rec.peer_gone = peer_gone
    sim.run(4, until=30.0)
    t0 = sim.now
    sim.crash_at(t0, "d2")
    sim.run(4, until=t0 + 60.0)
    last = sim.S - 1
    assert sim.S >= 3
    for n, k in sim.stage.items():
        if n == "d2" or n in sim.dead:
            continue
        expected = late_s if 0 < k < last and n not in sim.data else T.DETECT_S
        assert told.get(n) == pytest.approx(t0 + expected), (n, k)
