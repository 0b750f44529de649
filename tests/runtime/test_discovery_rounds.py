"""The discovery loop's DHT rounds (discovery.py `loop`): provider lookups every DHT_ROUND_S at first, then at
twice the interval after each round that found no one new, up to DHT_ROUND_MAX_S, and at once again when the
node's place changes or a round found someone; the revocation list from the host's own DHT copy every round (when the
copy changed) and over the network every REVOCATIONS_EVERY_S; each of those waits drawn within `spread_by` of its value
(exact here with `spread_by=0.0`, spread in the last test)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio
import trio.testing

from gwtf_node.runtime.net import discovery as disc
from gwtf_node.runtime.net.discovery import Discovery
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place


class _Records:
    """A DHT that names a new provider at the lookups listed in `news` (by count), and no one otherwise."""

    def __init__(self, news: set[int]) -> None:
        self.news = news
        self.lookups: list[tuple[float, str]] = []  # (time, key) of each provider lookup
        self.reads: list[float] = []  # network reads
        self.local_reads: list[float] = []
        self.puts = 0

    async def put(self, key: str, value) -> None:
        self.puts += 1

    async def get(self, key: str, local_only: bool = False):
        (self.local_reads if local_only else self.reads).append(trio.current_time())

    async def providers(self, key: str, unknown):
        self.lookups.append((trio.current_time(), key))
        n = len(self.lookups)
        if n in self.news:
            return [(f"NEW{n}", ["/ip4/127.0.0.1/tcp/9"], "relay", 0)]
        return []


@pytest.mark.trio
async def test_lookups_slow_down_while_they_find_no_one(autojump_clock: trio.testing.MockClock) -> None:
    records = _Records(news={6})  # (one key per round: a data node looks at the run key only)
    dials: list[tuple[str, ...]] = []
    async with trio.open_nursery() as nursery:
        peers = Peers("ME", "d0", 2, Place("data", -1, 4))
        peers.upsert(PeerInfo("P", "relay", 0, "r0"), 0.0)
        wire = SimpleNamespace(me="ME", spawn=lambda fn, *a: dials.append(a))
        copy = {"raw": None}  # this host's DHT copy of the revocation list
        host = SimpleNamespace(addrs=["/ip4/127.0.0.1/tcp/1"], provide=lambda key: trio.sleep(0),
                               on_addrs_changed=None, dht_local=lambda key: copy["raw"])
        d = Discovery(wire, peers, host, SimpleNamespace(run_id="run", to_json=lambda: "{}"), {},
                      on_peer_hello=lambda info: None, authorizer=SimpleNamespace(insecure=False), records=records, spread_by=0.0)
        nursery.start_soon(d.loop)
        start = trio.current_time()
        await trio.sleep(100)
        copy["raw"] = b"list 1"  # a revocation list stored here by a peer: read at the next round, once
        await trio.sleep(900)
        moved_at = trio.current_time()
        peers.place = Place("relay", 1, 4)  # placed elsewhere: published and looked up again at once
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    times = [t - start for t, _ in records.lookups]
    gaps = [round(b - a) for a, b in zip(times, times[1:])]
    # the first rounds 2 s apart, then 4, 8, 16, 32; the 6th lookup found someone (dialled): 2 s again, then doubling
    assert gaps[:6] == [2, 4, 8, 16, 32, 2] and gaps[6:13] == [4, 8, 16, 32, 64, 128, 256], gaps
    assert max(g for t, g in zip(times, gaps) if t < moved_at - start) == disc.DHT_ROUND_MAX_S
    assert len(dials) == 1
    # placed elsewhere: its new stage's keys looked up within one round
    assert any(0 <= t - (moved_at - start) <= disc.DHT_ROUND_S for t in times), times
    reads = [round(b - a) for a, b in zip(records.reads, records.reads[1:])]
    assert set(reads) == {disc.REVOCATIONS_EVERY_S}, reads
    assert len(records.local_reads) == 1 and 100 <= records.local_reads[0] - start <= 100 + disc.DHT_ROUND_S


class _FailingRecords(_Records):
    """A DHT whose puts fail (timed out on a loaded machine): each attempt's time is noted."""

    def __init__(self) -> None:
        super().__init__(news=set())
        self.put_times: list[float] = []

    async def put(self, key: str, value) -> None:
        self.put_times.append(trio.current_time())
        raise RuntimeError("no answer in time")


@pytest.mark.trio
async def test_a_publish_that_fails_is_tried_again_at_doubling_intervals(autojump_clock) -> None:
    """A put that fails is not tried again every round (each try is a walk of the DHT), and the provider lookups
    slow down as usual meanwhile: the record not published yet does not count as news every round."""
    records = _FailingRecords()
    async with trio.open_nursery() as nursery:
        peers = Peers("ME", "r0", 2, Place("relay", 0, 4))
        peers.upsert(PeerInfo("P", "data", -1, "d0"), 0.0)
        host = SimpleNamespace(addrs=["/ip4/127.0.0.1/tcp/1"], provide=lambda key: trio.sleep(0),
                               on_addrs_changed=None, dht_local=lambda key: None)
        d = Discovery(SimpleNamespace(me="ME", spawn=lambda fn, *a: None), peers, host,
                      SimpleNamespace(run_id="run", to_json=lambda: "{}"), {}, on_peer_hello=lambda info: None,
                      authorizer=SimpleNamespace(insecure=False), records=records, spread_by=0.0)
        nursery.start_soon(d.loop)
        start = trio.current_time()
        await trio.sleep(600)
        nursery.cancel_scope.cancel()
    puts = [round(t - start) for t in records.put_times]
    assert [b - a for a, b in zip(puts, puts[1:])][:7] == [2, 4, 8, 16, 32, 64, 128], puts
    rounds = sorted({round(t - start) for t, _ in records.lookups})
    assert [b - a for a, b in zip(rounds, rounds[1:])][:5] == [2, 4, 8, 16, 32], rounds


class _SlowProvides(_Records):
    """A DHT whose provides time out (a walk to twenty peers on a loaded machine) until the `ok_after`-th one."""

    def __init__(self, ok_after: int) -> None:
        super().__init__(news=set())
        self.ok_after = ok_after
        self.provides: list[str] = []

    async def provide(self, key: str) -> None:
        self.provides.append(key)
        if len(self.provides) < self.ok_after:
            await trio.sleep_forever()  # past DHT_WAIT_S


@pytest.mark.trio
async def test_a_publish_tried_again_starts_at_the_step_that_failed(autojump_clock) -> None:
    """The node record stored once is not stored again by the retries of a publish whose provider records timed
    out, and a provider key stored is not provided again; once everything is stored, nothing until the refresh."""
    records = _SlowProvides(ok_after=3)
    async with trio.open_nursery() as nursery:
        peers = Peers("ME", "r0", 2, Place("relay", 1, 4))
        peers.upsert(PeerInfo("P", "data", -1, "d0"), 0.0)
        host = SimpleNamespace(addrs=["/ip4/127.0.0.1/tcp/1"], provide=records.provide,
                               on_addrs_changed=None, dht_local=lambda key: None)
        d = Discovery(SimpleNamespace(me="ME", spawn=lambda fn, *a: None), peers, host,
                      SimpleNamespace(run_id="run", to_json=lambda: "{}"), {}, on_peer_hello=lambda info: None,
                      authorizer=SimpleNamespace(insecure=False), records=records, spread_by=0.0)
        nursery.start_soon(d.loop)
        await trio.sleep(disc.RECORD_REFRESH_S - 10)
        keys = disc.fanout.provided_keys("run", "relay", 1)
        assert len(keys) >= 2
        assert records.puts == 1  # the node record, once
        # two timed out, then each key once: the first key's retry, then the others
        assert records.provides == [keys[0], keys[0]] + list(keys)
        await trio.sleep(60)  # the refresh (RECORD_REFRESH_S after the publish ended) stores everything again
        nursery.cancel_scope.cancel()
    assert records.puts == 2 and records.provides[len(keys) + 2:] == list(keys)


@pytest.mark.trio
async def test_the_waits_of_nodes_started_together_are_spread(autojump_clock) -> None:
    """Two nodes started at the same moment (the default `spread_by`): their network reads of the revocation list
    and their record refreshes come at different moments, each wait within PERIOD_SPREAD of its period."""
    nodes = []
    async with trio.open_nursery() as nursery:
        for i in range(2):
            records = _Records(news=set())
            peers = Peers(f"ME{i}", f"r{i}", 2, Place("relay", 0, 4))
            peers.upsert(PeerInfo("P", "data", -1, "d0"), 0.0)
            host = SimpleNamespace(addrs=["/ip4/127.0.0.1/tcp/1"], provide=lambda key: trio.sleep(0),
                                   on_addrs_changed=None, dht_local=lambda key: None)
            d = Discovery(SimpleNamespace(me=f"ME{i}", spawn=lambda fn, *a: None), peers, host,
                          SimpleNamespace(run_id="run", to_json=lambda: "{}"), {}, on_peer_hello=lambda info: None,
                          authorizer=SimpleNamespace(insecure=False), records=records)
            nodes.append(records)
            nursery.start_soon(d.loop)
        await trio.sleep(3 * disc.REVOCATIONS_EVERY_S)
        nursery.cancel_scope.cancel()
    lo, hi = 1 - disc.PERIOD_SPREAD, 1 + disc.PERIOD_SPREAD
    gaps = [[b - a for a, b in zip(r.reads, r.reads[1:])] for r in nodes]
    for g in gaps:
        assert g and all(lo * disc.REVOCATIONS_EVERY_S - disc.DHT_ROUND_S <= x
                         <= hi * disc.REVOCATIONS_EVERY_S + disc.DHT_ROUND_S for x in g), g
    assert nodes[0].reads[1:] != nodes[1].reads[1:], gaps
    assert all(r.puts >= 2 for r in nodes)  # refreshed, each at its own moment
    assert gaps[0] != gaps[1]


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)
