"""The dashboard's node state is what the node does now (runtime/node/status.py derive_state)."""

from __future__ import annotations

import pytest

from gwtf_node.runtime.node.status import NodeState, derive_state

QUIET = dict(leaving=False, connecting=False, joining=False, paused=False, waiting_for_data=False, aggregating=False)


@pytest.mark.parametrize(("facts", "state"), [
    ({}, NodeState.TRAINING),
    ({"aggregating": True}, NodeState.AGGREGATING),
    # a relay whose data node left: not "training", even in the middle of its last iteration's aggregation
    ({"waiting_for_data": True}, NodeState.WAITING),
    ({"waiting_for_data": True, "aggregating": True}, NodeState.WAITING),
    ({"paused": True, "aggregating": True}, NodeState.PAUSED),
    ({"joining": True, "waiting_for_data": True}, NodeState.JOINING),
    ({"connecting": True, "joining": True}, NodeState.CONNECTING),
    ({"leaving": True, "connecting": True, "waiting_for_data": True}, NodeState.LEAVING),
])
def test_the_state_is_the_first_fact_that_holds(facts: dict, state: NodeState) -> None:
    assert derive_state(**{**QUIET, **facts}) is state
