"""Pooled formation in the training simulator (sim/train/pooling.py, `TrainSimOptions.pooled_formation`): the
pooled machines form and home the flows, every node hands over to its flow machine with the units homing
installed there, and training runs on those flows."""

from __future__ import annotations

import pytest

from gwtf_node.sim.train import TrainSim, TrainSimOptions, make_setting, swarm_placement


def run(pooled: bool, crash_plan: tuple = (), iterations: int = 2) -> TrainSim:
    sim = TrainSim(swarm_placement(make_setting("table6-x1", 0, None)),
                   TrainSimOptions(seed=0, pooled_formation=pooled, crash_plan=crash_plan))
    sim.run(iterations)
    return sim


def test_the_daemons_default_forms_per_data_node():
    assert TrainSimOptions().pooled_formation is False
    sim = run(False, iterations=1)
    assert not sim.pool_stats and not sim.pooled


def test_pooled_formation_homes_every_unit_and_the_run_trains_on_the_homed_flows():
    sim = run(True)
    rep = sim.report(2)
    demand = sum(sim.fnodes[d].cfg.capacity for d in sim.data)
    assert sim.pool_stats["traced"] == demand and sim.pool_stats["held"] == 0
    assert not sim.pooled and set(sim.fnodes) == set(sim.nodes)  # every node handed over
    for d in sim.data:  # each data node's units placed: homing sent every unit back to where it left
        cap = sim.fnodes[d].cfg.capacity
        assert sum(sim.fnodes[d].out[d].values()) == cap == sum(sim.fnodes[d].inn[d].values())
    assert sim.formation["formed_s"] >= sim.pool_stats["homed_s"]  # iteration 0 opened once homed
    assert [p["completed"] for p in rep["per_iteration"]] == [demand, demand]
    assert rep["lost_microbatches"] == 0


@pytest.mark.parametrize("victim", ["s1r1", "s3r0"])
def test_a_relay_that_crashes_while_the_flows_are_pooled_is_dropped_and_the_run_trains(victim):
    sim = run(True, crash_plan=((3.0, victim),))
    rep = sim.report(2)
    assert victim in sim.dead and sim.pool_stats and not sim.pooled
    assert all(victim not in fm.cfg.next_costs and victim not in fm.cfg.prev_costs
               for n, fm in sim.fnodes.items() if n not in sim.dead)
    assert all(p["finished"] for p in rep["per_iteration"])
