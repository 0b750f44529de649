"""A peer's deadline widens with this node's own event-loop lag (liveness.py `deadline_s`): on a machine with more
daemons than cores every loop runs seconds late, and a peer that answers late is not dead."""

from __future__ import annotations

import pytest

from test_busy_liveness import _relay_with_a_data_node


@pytest.mark.trio
async def test_the_deadline_widens_with_this_nodes_loop_lag() -> None:
    lv, peers, dead, _work = _relay_with_a_data_node()
    assert lv.deadline_s("D0") == 6.0  # a loop that never ran late: the floor
    lv.lag.max_lag_s = 4.5  # this node's loop once woke 4.5 s late
    assert lv.deadline_s("D0") == 9.0
    peers.heard("D0", 0.0)
    for t in range(1, 10):
        lv.check(float(t))
    assert dead == []
    lv.check(10.0)
    assert dead == ["D0"]
