"""Label waves over slow links: message delays of hundreds of milliseconds, unrelated to the links' costs (a
loaded host's event loops, or links whose latency is not what their cost prices).  The waves' labels then fall
for seconds after a relay first hears them, and a relay that moved a unit on the first of them, or a data node
whose stuck timer started the next wave before the last one had stood still, left units parked for good (6 of
11 placed with 50-200 ms, 4 of 11 with 100-1000 ms).  A relay now waits, on a formation wave, at least as long
as the previous wave's labels took to stop falling at it (flow/waves.py, `span`), and each stuck wave of one
launch waits twice as long as the one before (flow/launches.py, `arm_stuck`)."""

from __future__ import annotations

import pytest

from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import delayed_layered


@pytest.mark.parametrize("stages, per_stage, delay_ms, seed", [
    (5, 11, (50.0, 200.0), 1),
    (5, 11, (100.0, 1000.0), 1),
])
def test_flows_form_exactly_over_links_of_seconds_of_delay(stages, per_stage, delay_ms, seed):
    sc = delayed_layered(stages, per_stage, delay_ms, seed)
    res = run_gwtf(sc, seed=seed, rounds=300, quiet_rounds=60)
    best = optimal_routing(sc, seed)
    assert best.num_flows == per_stage
    assert res.num_flows == per_stage and res.extra["inconsistent_links"] == 0
    assert res.total_cost == best.total_cost
