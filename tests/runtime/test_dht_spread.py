"""The DHT's periodic maintenance (hostdht.py `SpreadDHT`): the steps of py-libp2p's own loop, at start and then a
period apart give or take PERIOD_SPREAD, drawn each time (`spread`)."""

from __future__ import annotations

import inspect
import random
import re
from types import SimpleNamespace

import pytest
import trio
from libp2p.kad_dht.kad_dht import ROUTING_TABLE_REFRESH_INTERVAL, KadDHT

from gwtf_node.runtime.net.hostdht import PERIOD_SPREAD, SpreadDHT, spread


def test_spread_stays_within_its_share_and_varies() -> None:
    rng = random.Random(0)
    drawn = [spread(600.0, rng) for _ in range(200)]
    assert all(600 * (1 - PERIOD_SPREAD) <= x <= 600 * (1 + PERIOD_SPREAD) for x in drawn)
    assert max(drawn) - min(drawn) > 600 * PERIOD_SPREAD  # spread over most of the range, not a constant
    assert spread(600.0, rng, by=0.0) == 600.0


def _steps(fn) -> list[str]:
    """The maintenance calls a loop makes, in order (`self.<name>(`)."""
    return re.findall(r"self\.([\w.]+)\(", inspect.getsource(fn))


def test_the_loop_does_what_py_libp2p_s_loop_does() -> None:
    """A py-libp2p that changed its maintenance (new steps, other names) fails here, not silently at run time."""
    assert _steps(SpreadDHT._run_main_loop) == _steps(KadDHT._run_main_loop)


@pytest.mark.trio
async def test_maintenance_runs_at_start_then_spread_apart(autojump_clock) -> None:
    runs: list[float] = []

    async def refresh() -> None:
        runs.append(trio.current_time())

    async def nothing(*a) -> None:
        return None

    store = SimpleNamespace(_republish_provider_records=nothing, _republish_records=nothing, cleanup_expired=lambda: 0)
    fake = SimpleNamespace(manager=SimpleNamespace(is_running=True), refresh_routing_table=refresh,
                           provider_store=store, value_store=store, peer_routing=None)
    start = trio.current_time()
    with trio.move_on_after(10 * ROUTING_TABLE_REFRESH_INTERVAL):
        await SpreadDHT._run_main_loop(fake)
    gaps = [b - a for a, b in zip(runs, runs[1:])]
    assert runs[0] == start
    assert len(gaps) >= 8
    assert all((1 - PERIOD_SPREAD) * ROUTING_TABLE_REFRESH_INTERVAL <= g
               <= (1 + PERIOD_SPREAD) * ROUTING_TABLE_REFRESH_INTERVAL for g in gaps), gaps
    assert len({round(g, 3) for g in gaps}) == len(gaps)  # drawn each time
