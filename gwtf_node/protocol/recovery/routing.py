"""Choosing next hops, deadlines, room and denials: the helpers every side of the machine uses."""

from __future__ import annotations

from ..effects import CancelTimer, Send
from ..messages import MbDeny, MbState, Room
from ..pipeline import pick_next_hop
from .records import (
    SLOT_PHASES, TIMERS, DataRecord, Key, MbTimer, Policy, RecoveryEffect, RelayPhase, Source,
)


class Routing:
    """Part of `RecoveryNode` (node.py): one mechanism of the machine, see the module docstring."""

    def _live_next(self) -> list[str]:
        return self.peers.live_next()

    def _slots_used(self) -> int:
        if self.is_data:
            return 0
        return sum(1 for r in self.mbs.values() if r.phase in SLOT_PHASES)

    def _inflight(self, j: str, d: str | None = None) -> int:
        """Microbatches whose activations I sent to j and j still holds (they occupy a unit / a slot)."""
        n = 0
        for m in self.mbs.values():
            if m.next != j or (d is not None and m.key.data_node != d):
                continue
            if self.is_data or m.phase in SLOT_PHASES:
                n += 1
        return n

    def _waiting_to(self, j: str) -> int:
        if self.is_data:
            return sum(1 for m in self.mbs.values() if m.next == j and m.src is Source.SENDING)
        return sum(1 for m in self.mbs.values() if m.next == j and m.phase is RelayPhase.SENDING)

    def _deadline(self, now: float, j: str) -> float:
        e = self.peers.est.get(j, self.cfg.default_prior_s)
        return now + self.cfg.k * e * (1 + self._waiting_to(j)) + self.cfg.margin_s

    def _measure(self, j: str, sample: float) -> None:
        self.peers.measure(j, sample)

    def _gone_ahead(self, m: DataRecord, gone: set) -> bool:
        """A holder of m's path in `gone` whose stage has not reported its backward: the backward cannot pass it."""
        return any(h in gone and s not in m.bwd_done for s, h in enumerate(m.path))

    def _room_for(self, j: str) -> bool:
        cap = self.cfg.swarm_assumed_capacity if self.swarm else self.peers.peer_cap.get(j, 1)
        return self._inflight(j) < cap

    def _greedy(self, exclude: set) -> str | None:
        """The cheapest live next peer with room (the `random` policy: one of them at random)."""
        c = sorted((self.peers.next_peers[j], j) for j in self._live_next()
                   if j not in self.peers.full and j not in exclude and self._room_for(j))
        if not c:
            return None
        return self.rng.choice(c)[1] if self.policy is Policy.RANDOM else c[0][1]

    def _choose_next(self, d: str, exclude: set, *, fresh: bool = False) -> str | None:
        """Next hop for a microbatch of data node d; `fresh`: a new launch (flows only)."""
        if not self.is_data and self.stage == self.cfg.last_stage:
            return d
        if self.swarm:
            return self._greedy(exclude)
        ok = [j for j in self._live_next() if j not in self.peers.full and j not in exclude]
        units = self.peers.out.get(d, {})
        if self.is_data and self.data.lent:  # units lent to me (Lend) for this iteration
            units = dict(units)
            for j, n in self.data.lent.items():
                units[j] = units.get(j, 0) + n
        inflight = {j: self._inflight(j, d) for j in units}
        costs = self.peers.next_peers
        if self.is_data and fresh and self.cfg.fastest_unit:  # data.py, "Fastest unit first"
            costs = {j: (self.data.rt.get(j, self.data.e2e_est), self.peers.next_peers.get(j, float("inf"))) for j in units}
        hop = pick_next_hop(units, inflight, costs, ok)
        if hop is not None:
            return hop
        if self.cfg.lend and not fresh:
            for d2 in sorted(d2 for d2 in self.peers.out if d2 != d):  # another data node's idle unit, before a repair
                u2 = self.peers.out[d2]
                hop = pick_next_hop(u2, {j: self._inflight(j, d2) for j in u2}, self.peers.next_peers, ok)
                if hop is not None:
                    return hop
        if fresh and any(units.get(j, 0) > 0 for j in ok):
            return None  # the flows are busy: wait for a slot
        hop = self._greedy(exclude)  # local repair: a live peer with room takes a unit
        if hop is not None:
            self.peers.repair_unit(d, hop)
        return hop

    def _presume_dead(self, j: str | None) -> None:
        if j is None or j in self.peers.dead or j in self.cfg.data_nodes:
            return
        self.peers.presume_dead(j, repair=not self.swarm)
        self.stats.bump(presumed_dead=1)

    def _cancel(self, key: Key, eff: list[RecoveryEffect]) -> None:
        for t in TIMERS:
            eff.append(CancelTimer(MbTimer(t, key)))

    def _room(self, eff: list[RecoveryEffect]) -> None:
        if self.peers.denied and not self.is_data and (self.stage == self.cfg.last_stage or self._live_next()):
            free = self.cfg.capacity - self._slots_used()
            if free > 0:
                for p in sorted(self.peers.denied):
                    eff.append(Send(p, Room(free)))
                self.peers.room_told()

    def _drop(self, key: Key, eff: list[RecoveryEffect]) -> None:
        if self._forget(key) is None:
            return
        self._cancel(key, eff)
        self._room(eff)

    def _deny(self, to: str, key: Key, attempt: int, eff: list[RecoveryEffect]) -> None:
        self.stats.bump(denies_sent=1)
        self.peers.deny(to)
        eff.append(Send(to, MbDeny(*key, attempt)))

    def _report(self, key: Key, attempt: int, state: RelayPhase, eff: list[RecoveryEffect]) -> None:
        eff.append(Send(key.data_node, MbState(*key, attempt, self.stage, state.value)))
