"""Pooled formation: several data nodes' units formed as one commodity, then sent home (homing.py).

With several data nodes the per-commodity flow machines end 14-17 % above the
multi-commodity LP bound at their worst (docs/bench_flow.md): each data node's
units race the others' for the cheap relays.  Formed as *one* commodity they
are exact (successive shortest paths with label waves, as with one data node),
and what is left is to send each unit back to the data node it left.

The network of pooled formation puts each data node's two sides into stages of
their own: its *source* side (a relay before stage 0, holding as many units as
the data node's demand) and its *sink* side (after the last stage, the same),
and one *pool* data node linked to every source and sink side at no cost.  The
flow machines (`FlowNode`, unchanged) then form a min-cost maximum flow from
the pool back to itself, in which a unit leaves some data node and ends at the
cheapest one.  `PoolMachine` wraps each of those machines and adds homing, led
by the pool once its flows are still (`PoolConfig.quiet_s`):

1. `HomingStart` to every source side, which sends one `TraceUnit` per unit it
   sent; each relay adds itself and passes it on along a unit of its own not
   traced in this round; the sink side adds where it ended and hands it to the
   pool.  A unit held on its way (a relay, or the source side, with no unit of
   its own left to follow) goes to the pool ended nowhere: homing leaves it
   out.
   The pool starts once its flows are formed: no launch out, and the whole
   demand placed or a wave begun `no_route_s` ago (and twice as long as the
   last wave with a route took) that gives it no route, twice: the first
   time the pool starts a wave from scratch (`_formed`).
2. `CostQuery` to every relay on a traced path: its link costs to the relays
   the other units use at the next stage (at the first stage, to every data
   node's source side; at the last, to every sink side); `CostReply`.
3. The pool computes the homed units (`homing.home_units`: suffix swaps, units
   still away to the data node cheapest for them, exchanges, spreading) and sends each
   node on a homed path its routes per data node (`Install`; an empty one to
   every other node on a traced path and every data node's side).  From then
   on a node's `inn` / `out` are the installed per-data-node counts, and its
   flow machine takes no more messages.

A round not done in `round_timeout_s` (a token or a reply lost) is started
again, at most `max_rounds` times.  Pure: the driver hands in `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..effects import Effect, Send, SetTimer
from ..messages import INF
from ..homingmsgs import CostQuery, CostReply, HomingStart, Install, Route, TraceUnit
from . import launches
from .homing import Unit, home_units
from .node import FlowNode

RELAY, SOURCE, SINK, POOL = "relay", "source", "sink", "pool"
TICK = ("pool", "tick")  # the pool's timer key (the flow machine's are strings)
PLACED, NO_ROUTE, STALLED = "placed", "no route", "stalled"  # why the pool's flows count as formed (`_formed`)


@dataclass(frozen=True)
class PoolConfig:
    role: str  # RELAY, SOURCE, SINK or POOL
    data_node: str = ""  # SOURCE / SINK: the data node whose side this is
    sources: Mapping[str, str] = field(default_factory=dict)  # POOL: each source side's id -> its data node
    sinks: Mapping[str, str] = field(default_factory=dict)  # POOL: each sink side's id -> its data node
    demand: Mapping[str, int] = field(default_factory=dict)  # POOL: each data node's demand
    quiet_s: float = 3.0  # POOL: homing starts once its flows are formed and still this long (`_formed`)
    no_route_s: float = 10.0  # POOL: ... or once a wave has given it no route this long (`_formed`)
    stall_s: float = 60.0  # POOL: ... or once a launch has been out this long with its flows unchanged (`_formed`)
    round_timeout_s: float = 10.0  # POOL: a homing round not done by then starts again
    max_rounds: int = 3
    tick_s: float = 0.5


@dataclass
class HomingStats:
    rounds: int = 0
    traced: int = 0  # units traced in the round that homed them
    held: int = 0  # units of that round held on their way (a relay with no unit of its own left to follow)
    queries: int = 0
    homed_at: float | None = None
    steps: dict = field(default_factory=dict)  # homing.home_units' counts
    pooled: tuple[Unit, ...] = ()  # the traced units (data node left, relays, data node reached)
    homed: tuple[Unit, ...] = ()


class PoolMachine:
    """A flow machine of pooled formation with homing (module doc)."""

    def __init__(self, inner: FlowNode, pcfg: PoolConfig) -> None:
        self.inner, self.pcfg = inner, pcfg
        self.commodity = inner.cfg.commodities[0]  # the pool's id
        self.round = 0
        self.slots: dict[str, int] = {}  # RELAY: units not traced yet in this round, per next peer
        self.installed: dict[str, dict[str, dict[str, int]]] | None = None  # per data node: "inn"/"out" counts
        self.stats = HomingStats()
        self.tokens: list[Unit] = []  # POOL: this round's traced units
        self.held: list[Unit] = []  # POOL: this round's units held on their way (no data node reached: "")
        self.expected = 0
        self.costs: dict[tuple[str, str], float] = {}
        self.waiting: set[str] = set()  # POOL: relays asked and not answered
        self.deadline = 0.0
        self.confirm_epoch = -1  # POOL: the wave it started from scratch when a wave first gave it no route

    cfg = property(lambda self: self.inner.cfg)
    homed = property(lambda self: self.installed is not None)

    @property
    def inn(self) -> dict[str, dict[str, int]]:
        return self.inner.inn if self.installed is None else {d: r["inn"] for d, r in self.installed.items()}

    @property
    def out(self) -> dict[str, dict[str, int]]:
        return self.inner.out if self.installed is None else {d: r["out"] for d, r in self.installed.items()}

    def start(self, now: float) -> list[Effect]:
        eff = self.inner.start(now)
        if self.pcfg.role == POOL:
            eff.append(SetTimer(TICK, now + self.pcfg.tick_s))
        return eff

    def on_timer(self, now: float, key) -> list[Effect]:
        if key == TICK:
            return self._tick(now)
        return [] if self.homed else self.inner.on_timer(now, key)

    def on_message(self, now: float, sender: str, msg) -> list[Effect]:
        t = type(msg)
        if t is TraceUnit:
            return self._on_trace(now, msg)
        if t is HomingStart:
            return self._on_start(msg)
        if t is CostQuery:
            return self._on_query(sender, msg)
        if t is CostReply:
            return self._on_reply(now, sender, msg)
        if t is Install:
            self._on_install(msg)
            return []
        return [] if self.homed else self.inner.on_message(now, sender, msg)

    # ---------------------------------------------------------------- every role

    def _on_start(self, msg: HomingStart) -> list[Effect]:
        if self.pcfg.role != SOURCE or self.homed:
            return []
        eff: list[Effect] = []
        for peer, n in sorted(self.inner.out[self.commodity].items()):
            eff += [Send(peer, TraceUnit(msg.round, self.pcfg.data_node, ())) for _ in range(n)]
        held = sum(self.inner.inn[self.commodity].values()) - sum(self.inner.out[self.commodity].values())
        return eff + [Send(self.commodity, TraceUnit(msg.round, self.pcfg.data_node, ())) for _ in range(held)]

    def _on_trace(self, now: float, msg: TraceUnit) -> list[Effect]:
        if self.pcfg.role == SINK:
            return [Send(self.commodity, TraceUnit(msg.round, msg.origin, msg.path, self.pcfg.data_node))]
        if self.pcfg.role == POOL:
            return self._collect(now, msg)
        if self.pcfg.role != RELAY or self.homed or msg.round < self.round:
            return []
        if msg.round > self.round:
            self.round, self.slots = msg.round, {p: n for p, n in self.inner.out[self.commodity].items() if n > 0}
        peer = next((p for p in sorted(self.slots) if self.slots[p] > 0), None)
        if peer is not None:
            self.slots[peer] -= 1
        # (no unit of its own left to follow: one held here, a launch on its way, goes to the pool ended nowhere)
        to = self.commodity if peer is None else peer
        return [Send(to, TraceUnit(msg.round, msg.origin, (*msg.path, self.inner.cfg.node_id)))]

    def _on_query(self, sender: str, msg: CostQuery) -> list[Effect]:
        links = {**self.inner.cfg.prev_costs, **self.inner.cfg.next_costs}
        costs = tuple((p, links[p]) for p in msg.peers if p in links)
        return [Send(sender, CostReply(msg.round, costs))]

    def _on_install(self, msg: Install) -> None:
        if self.pcfg.role == POOL or msg.round < self.round:
            return
        self.round = msg.round
        installed: dict[str, dict[str, dict[str, int]]] = {}
        for r in msg.routes:
            side = installed.setdefault(r.commodity, {"inn": {}, "out": {}})
            if self.pcfg.role != SOURCE:
                side["inn"][r.prev] = side["inn"].get(r.prev, 0) + r.count
            if self.pcfg.role != SINK:
                side["out"][r.next] = side["out"].get(r.next, 0) + r.count
        self.installed = installed

    # ---------------------------------------------------------------- the pool

    def _tick(self, now: float) -> list[Effect]:
        eff: list[Effect] = [SetTimer(TICK, now + self.pcfg.tick_s)]
        if self.homed or self.stats.rounds >= self.pcfg.max_rounds:
            return eff[:0]
        running = self.stats.rounds > 0 and now < self.deadline
        m = self.inner
        formed = self._formed(now)
        if running or not formed:
            return eff
        if formed == NO_ROUTE and self.confirm_epoch != m.labels.epoch[self.commodity]:  # a wave from scratch first
            m.now = now
            launches.new_wave(m, now, eff)
            self.confirm_epoch = m.labels.epoch[self.commodity]
            return eff
        self.stats.rounds += 1
        self.round += 1
        self.deadline = now + self.pcfg.round_timeout_s
        self.tokens, self.held, self.costs, self.waiting = [], [], {}, set()
        sent = {p: n for p, n in m.out[self.commodity].items() if n > 0}
        self.expected = sum(sent.values())
        eff += [Send(p, HomingStart(self.round)) for p in sorted(sent)]
        return eff

    def _formed(self, now: float) -> str:
        """The pool's flows are formed: no launch out, its flows unchanged for `quiet_s`, and either the whole
        demand placed or its current wave giving it no route (the maximum flow) although it began `no_route_s` ago
        or more, and twice the time the last wave that gave it a route took to reach it: a loaded daemon's waves
        take seconds, and relays that start late add links that lower the labels within the wave.  The first time
        a wave gives it no route, the pool starts a wave from scratch (`_tick`): labels a relay kept from before its
        links were complete, or deferred, are recomputed; only if that wave gives no route either are the flows the
        maximum flow (`NO_ROUTE`).  A launch out while its flows have not changed for `stall_s` is a unit held on
        its way (a relay waiting for still labels while new waves keep coming): the flows are homed without it
        (`STALLED`; the relay that holds it sends its trace to the pool ended nowhere, and the Install leaves it
        out).  Returns "" (not formed), `PLACED`, `NO_ROUTE` or `STALLED`."""
        m, quiet = self.inner, self.pcfg.quiet_s
        if m.pending or m.token_pending or now - m.stats.last_change < quiet:
            return ""
        if m.launch.pending > 0:
            return STALLED if now - m.stats.last_change >= self.pcfg.stall_s else ""
        if sum(m.out[self.commodity].values()) >= m.launch.demand:
            return PLACED  # every data node's whole demand placed
        label = m.my_out.get(self.commodity)
        waited = max(quiet, self.pcfg.no_route_s, 2 * (m.launch.wave_s or 0.0))
        return NO_ROUTE if now - m.launch.wave_started >= waited and (label is None or label.cost == INF) else ""

    def _collect(self, now: float, msg: TraceUnit) -> list[Effect]:
        if msg.round != self.round or self.homed or len(self.tokens) + len(self.held) >= self.expected:
            return []
        (self.tokens if msg.end else self.held).append((msg.origin, msg.path, msg.end))
        if len(self.tokens) + len(self.held) < self.expected:  # (a unit held on its way counts: it is traced)
            return []
        if not self.tokens:
            return self._install(now)
        stages = max(len(u[1]) for u in self.tokens)
        used = [sorted({u[1][k] for u in self.tokens if len(u[1]) == stages}) for k in range(stages)]
        eff: list[Effect] = []
        for k, relays in enumerate(used):
            ask = list(used[k + 1]) if k + 1 < stages else sorted(self.pcfg.sinks)
            if k == 0:
                ask += sorted(self.pcfg.sources)
            for r in relays:
                self.waiting.add(r)
                eff.append(Send(r, CostQuery(self.round, tuple(ask))))
        self.stats.queries += len(self.waiting)
        return eff

    def _on_reply(self, now: float, sender: str, msg: CostReply) -> list[Effect]:
        if self.pcfg.role != POOL or msg.round != self.round or sender not in self.waiting or self.homed:
            return []
        self.waiting.discard(sender)
        for peer, c in msg.costs:
            if peer in self.pcfg.sources:
                self.costs[(self.pcfg.sources[peer], sender)] = c
            elif peer in self.pcfg.sinks:
                self.costs[(sender, self.pcfg.sinks[peer])] = c
            else:
                self.costs[(sender, peer)] = c
        return [] if self.waiting else self._install(now)

    def _install(self, now: float) -> list[Effect]:
        homed, steps = home_units(self.tokens, lambda a, b: self.costs.get((a, b)), self.pcfg.demand)
        counts: dict[str, dict[tuple[str, str, str], int]] = {}  # node -> (data node, prev, next) -> units
        for d, path, _ in homed:
            hops = (d, *path, d)
            for k, node in enumerate(path):
                key = (d, hops[k], hops[k + 2])
                counts.setdefault(node, {})[key] = counts.setdefault(node, {}).get(key, 0) + 1
        sides = {d: s for s, d in self.pcfg.sources.items()}
        sinks = {d: s for s, d in self.pcfg.sinks.items()}
        for d, path, _ in homed:
            for side, key in ((sides[d], (d, d, path[0])), (sinks[d], (d, path[-1], d))):
                counts.setdefault(side, {})[key] = counts.setdefault(side, {}).get(key, 0) + 1
        eff: list[Effect] = []
        told = set(counts) | {r for u in (*self.tokens, *self.held) for r in u[1]} | set(self.pcfg.sources) \
            | set(self.pcfg.sinks)
        for node in sorted(told):  # (every node that held pooled units, so that each knows homing is over)
            routes = tuple(Route(d, p, n, c) for (d, p, n), c in sorted(counts.get(node, {}).items()))
            eff.append(Send(node, Install(self.round, routes)))
        self.installed = {}
        self.stats.traced, self.stats.held = len(self.tokens), len(self.held)
        self.stats.homed_at, self.stats.steps = now, steps
        self.stats.pooled, self.stats.homed = tuple(self.tokens), tuple(homed)
        return eff
