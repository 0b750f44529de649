"""The host's DHT half: versioned records and provider records over py-libp2p's Kademlia.

`KadDHT` in server mode (`SpreadDHT`), started after the bootstrap peers are
connected (its first routing-table refresh runs at start, the next ones
`ROUTING_TABLE_REFRESH_INTERVAL`, 600 s, apart give or take `PERIOD_SPREAD`
drawn each time: `spread`).  Records live under the
namespace "gwtf" and carry an 8-byte big-endian version before the value;
the validator's `select` picks the highest version (ties: the larger
bytes), so all holders converge.  `dht_get` asks the closest peers as well
as the local store (py-libp2p's `get_value` answers from the local copy
alone, which goes stale).  The DHT is for discovery; liveness is the
protocol's business.  `dht_ops` counts the operations this host started, by
kind (put, get, provide, find_providers: each a walk over the closest peers;
status.json "sent" "dht").  `HostDht` is a base class of `host.Host`, which sets
`libp2p` and `dht`.
"""

from __future__ import annotations

import hashlib
import logging
import random
import struct
import time
from collections.abc import Callable

import trio
from libp2p.abc import IHost
from libp2p.exceptions import BaseLibp2pError
from libp2p.kad_dht.kad_dht import ROUTING_TABLE_REFRESH_INTERVAL, KadDHT
from libp2p.peer.id import ID
from libp2p.records.validator import Validator
from libp2p.tools.anyio_service import background_trio_service

log = logging.getLogger("gwtf.transport")

DHT_NAMESPACE = "gwtf"
DHT_QUERY_TIMEOUT_S = 10.0  # bound on one dht_get / dht_put / find_providers
_VERSION = struct.Struct(">Q")
_PEER_ERRORS = (BaseLibp2pError, OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)
# a periodic DHT chore (a refresh, a republish: walks over twenty peers each) waits its period times a factor drawn
# from [1 - PERIOD_SPREAD, 1 + PERIOD_SPREAD] each time (`spread`)
PERIOD_SPREAD = 0.25


def spread(period: float, rng: random.Random, by: float = PERIOD_SPREAD) -> float:
    """`period` times a factor drawn from [1 - by, 1 + by].  Daemons started together (a local swarm, a host
    that restarts many) would otherwise walk the DHT at the same moments every period: 100 daemons on 2 cores
    started within 3 minutes refreshed together 600 s after their start, and the iteration running then took
    100-160 s instead of 2-19."""
    return period * rng.uniform(1.0 - by, 1.0 + by)


class SpreadDHT(KadDHT):
    """py-libp2p's KadDHT whose maintenance runs `spread` apart.  py-libp2p 0.8.1's `_run_main_loop` runs its
    maintenance (a routing-table refresh: a walk for its own id and one per non-empty bucket; the republish
    and the expiry of stored records) at start and then every `ROUTING_TABLE_REFRESH_INTERVAL` exactly; this
    loop does the same steps, at start and then `spread` apart (`tests/runtime/test_dht_spread.py` checks the
    steps against py-libp2p's loop)."""

    async def _run_main_loop(self) -> None:
        rng = random.Random()
        while self.manager.is_running:
            try:
                await self.refresh_routing_table()
                await self.provider_store._republish_provider_records()
                await self.value_store._republish_records(self.peer_routing)
                self.value_store.cleanup_expired()
                self.provider_store.cleanup_expired()
            except Exception as e:  # noqa: BLE001 - as py-libp2p's loop: maintenance is tried again next time
                log.warning("DHT maintenance failed: %r", e)
            await trio.sleep(spread(ROUTING_TABLE_REFRESH_INTERVAL, rng))


class VersionedValidator(Validator):
    """DHT records `u64 version | value`; the highest version wins."""

    def validate(self, key: str, value: bytes) -> None:
        if len(value) < _VERSION.size:
            raise ValueError(f"record for {key} has {len(value)} bytes, less than its 8-byte version")

    def select(self, key: str, values: list[bytes]) -> int:
        best = max(range(len(values)), key=lambda i: (_VERSION.unpack_from(values[i])[0], values[i]))
        return best


def pack_record(version: int, value: bytes) -> bytes:
    return _VERSION.pack(version) + value


def unpack_record(data: bytes) -> tuple[int, bytes]:
    return _VERSION.unpack_from(data)[0], data[_VERSION.size:]


class HostDht:
    """The DHT methods of a host (`libp2p`: the py-libp2p host; `dht`: its KadDHT, or None without one)."""

    libp2p: IHost
    dht: KadDHT | None

    def _require_dht(self, op: str | None = None) -> KadDHT:
        if op is not None:
            ops = self.__dict__.setdefault("dht_ops", {})
            ops[op] = ops.get(op, 0) + 1
        if self.dht is None:
            raise RuntimeError("this host was opened with dht=False")
        return self.dht

    @staticmethod
    def _dht_key(key: str) -> str:
        return f"/{DHT_NAMESPACE}/{key}"

    async def dht_put(self, key: str, value: bytes, *, version: int | None = None) -> int:
        """Store `value` under `key` with `version` (default: now in ns, above any known one)."""
        dht = self._require_dht("put")
        if version is None:
            known = dht.value_store.get(self._dht_key(key).encode())
            floor = unpack_record(known.value)[0] + 1 if known is not None else 0
            version = max(time.time_ns(), floor)
        with trio.fail_after(DHT_QUERY_TIMEOUT_S):
            await dht.put_value(self._dht_key(key), pack_record(version, value))
        return version

    async def dht_get_record(self, key: str, *, accept: Callable[[int, bytes], bool] | None = None,
                             local_only: bool = False) -> tuple[int, bytes] | None:
        """(version, value) of the highest version held locally or by the closest peers; with `accept`, of the
        highest among those it accepts (records.py: a forged record of a higher version hides no genuine one).
        `local_only`: this host's own copy only (what peers stored here), no walk over the network."""
        dht = self._require_dht(None if local_only else "get")
        full = self._dht_key(key)
        kb = full.encode()
        validator = VersionedValidator()
        found: list[bytes] = []
        local = dht.value_store.get(kb)
        if local is not None:
            found.append(local.value)
        if local_only:
            found = [v for v in found if accept is None or accept(*unpack_record(v))]
            return unpack_record(found[0]) if found else None

        async def ask(peer: ID) -> None:
            with trio.move_on_after(DHT_QUERY_TIMEOUT_S / 2):
                try:
                    value = await dht.value_store._get_from_peer(peer, kb)
                except _PEER_ERRORS as e:
                    log.debug("dht get %s from %s failed: %r", key, peer, e)
                    return
                if isinstance(value, bytes):
                    try:
                        validator.validate(full, value)
                    except ValueError as e:
                        log.warning("dht record %s from %s refused: %s", key, peer, e)
                        return
                    found.append(value)

        peers: list[ID] = []
        with trio.move_on_after(DHT_QUERY_TIMEOUT_S / 2):
            peers = await dht.peer_routing.find_closest_peers_network(kb)
        async with trio.open_nursery() as nursery:
            for peer in set(peers):
                if peer != self.libp2p.get_id():
                    nursery.start_soon(ask, peer)
        if accept is not None:
            found = [v for v in found if accept(*unpack_record(v))]
        if not found:
            return None
        best = found[validator.select(full, found)]
        if local is None or best != local.value:
            dht.value_store.put(kb, best)  # refresh our stale copy
        return unpack_record(best)

    def dht_local(self, key: str) -> bytes | None:
        """This host's own stored copy of `key` (the packed record, unchecked), if any."""
        dht = self.dht
        local = dht.value_store.get(self._dht_key(key).encode()) if dht is not None else None
        return None if local is None else local.value

    async def dht_get(self, key: str) -> bytes | None:
        record = await self.dht_get_record(key)
        return None if record is None else record[1]

    @staticmethod
    def _provider_key(key: str) -> str:
        return hashlib.sha256(f"gwtf-provider:{key}".encode()).hexdigest()

    async def provide(self, key: str) -> bool:
        with trio.fail_after(DHT_QUERY_TIMEOUT_S):
            return await self._require_dht("provide").provide(self._provider_key(key))

    async def find_providers(self, key: str) -> list[tuple[str, list[str]]]:
        """Peers that announced `key` (deduplicated), with their addresses."""
        with trio.fail_after(DHT_QUERY_TIMEOUT_S):
            infos = await self._require_dht("find_providers").find_providers(self._provider_key(key))
        out: dict[str, list[str]] = {}
        for info in infos:
            addrs = out.setdefault(info.peer_id.to_base58(), [])
            for a in info.addrs:
                if str(a) not in addrs:
                    addrs.append(str(a))
        return list(out.items())

    async def refresh_dht(self) -> None:
        """Refresh the DHT's routing table now (bounded): after the first bootstrap peer is reached,
        so that lookups know more than that one peer without waiting for the periodic refresh."""
        dht = self._require_dht()
        with trio.move_on_after(DHT_QUERY_TIMEOUT_S):
            try:
                await dht.refresh_routing_table()
            except _PEER_ERRORS as e:
                log.debug("DHT refresh failed: %r", e)

    async def start_dht(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the DHT service until cancelled (open_host does this)."""
        dht = self._require_dht()
        async with background_trio_service(dht):
            task_status.started()
            await trio.sleep_forever()


__all__ = ["DHT_NAMESPACE", "DHT_QUERY_TIMEOUT_S", "HostDht", "PERIOD_SPREAD", "SpreadDHT", "VersionedValidator",
           "pack_record", "spread", "unpack_record"]
