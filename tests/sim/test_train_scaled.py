"""Scaled formation in the training simulator (sim/train/scaled.py, `TrainSimOptions.scaled_formation`): one data
node's flows formed by cost scaling, handed to the flow machines at every node, and training runs on them; the
flows cost what the label waves' cost (to the 0.1 ms that cost scaling counts in).  A relay crashing while
formation runs calls it off, and the run trains all the same."""

from __future__ import annotations

import pytest

from gwtf_node.protocol.flow.scaled import LEFT_GRACE_S
from gwtf_node.protocol.flow.scaling import COST_QUANTUM_MS
from gwtf_node.sim.train import TrainSim, TrainSimOptions, make_setting

SETTING = "table2-heterogeneous"


def run(scaled: bool, seed: int = 0, crash_plan: tuple = (), iterations: int = 2, setting: str = SETTING) -> TrainSim:
    sim = TrainSim(make_setting(setting, seed, 1), TrainSimOptions(seed=seed, scaled_formation=scaled,
                                                                  crash_plan=crash_plan))
    sim.run(iterations)
    return sim


def cost(sim: TrainSim) -> tuple[int, float]:
    """The units the data node placed, and the flows' cost (ms): each live node's units out times the link's cost."""
    (d,) = sim.data
    units = sum(sim.fnodes[d].out[d].values())
    total = sum(n * fm.cfg.next_costs[p] for nid, fm in sim.fnodes.items() if nid not in sim.dead
                for outs in fm.out.values() for p, n in outs.items())
    return units, total


def run_default(setting: str = SETTING, iterations: int = 1) -> TrainSim:
    sim = TrainSim(make_setting(setting, 0, 1), TrainSimOptions(seed=0))
    sim.run(iterations)
    return sim


def test_the_daemons_default_is_auto_and_a_narrow_swarm_forms_with_label_waves():
    assert TrainSimOptions().scaled_formation is None and TrainSimOptions().flow_neighbours is None
    for sim in (run(False, iterations=1), run_default()):  # (fewer than 10 relays a stage: auto forms by waves)
        assert not sim.scaled and not sim.scaled_stats() and sim._k == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_scaled_formation_hands_over_everywhere_and_the_flows_cost_the_optimum(seed):
    sim, waves = run(True, seed), run(False, seed)
    stats = sim.scaled_stats()
    assert stats["over"] == ["formed"] and stats["phases"] > 0
    assert all(h.handed is not None for h in sim.scaled.values()) and set(sim.scaled) == set(sim.nodes)
    (d,) = sim.data
    assert sim.formation["formed_s"] >= sim.scaled[d].handed  # iteration 0 opened once the data node had its flows
    (units, total), (w_units, w_total) = cost(sim), cost(waves)
    assert units == w_units > 0
    assert total <= w_total + units * (sim.S + 1) * COST_QUANTUM_MS / 2 + 1e-9, (total, w_total)
    rep = sim.report(2)
    assert [p["completed"] for p in rep["per_iteration"]] == [units, units] and rep["lost_microbatches"] == 0


def test_the_data_node_opens_iteration_0_once_formation_is_over_and_trains_as_with_label_waves():
    """72 nodes: formation takes minutes of virtual time; the data node waits for it (it has no flows before, and
    would open with none), and the iterations then last what they last on the label waves' flows."""
    sim, waves = run(True, setting="table6-x4"), run(False, setting="table6-x4")
    (d,) = sim.data
    assert sim.scaled_stats()["over"] == ["formed"] and sim.formation["formed_s"] >= sim.scaled[d].handed > 60
    assert [p["iteration_s"] for p in sim.report(2)["per_iteration"]] == pytest.approx(
        [p["iteration_s"] for p in waves.report(2)["per_iteration"]])


def test_a_relay_that_crashes_while_the_flows_form_scaled_and_the_run_trains():
    waves = run(False)
    victim = next(r for r, fm in sorted(waves.fnodes.items()) if r not in waves.data and any(fm.out.values()))
    sim = run(True, crash_plan=((2.0, victim),), iterations=3)
    rep = sim.report(3)
    # its neighbours call formation off once it is not back within the grace (scaled.py LEFT_GRACE_S), and the
    # flow machines form the flows over the relays left
    assert sim.scaled_stats()["over"] == ["aborted"] and sim.formation["formed_s"] > LEFT_GRACE_S
    assert all(h.handed is not None for n, h in sim.scaled.items() if n not in sim.dead)
    assert all(p["finished"] for p in rep["per_iteration"]) and rep["lost_microbatches"] == 0
