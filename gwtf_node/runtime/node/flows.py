"""Link measurement and flow formation: the flow machine (`protocol/flow/`, section V-C) driven for real.

Once the swarm has been quiet for `settle_s` and the node knows a peer on each side (a relay: and a data node, else
its machine would carry no units; a side gone while measured is measured again), `form` measures a round trip to each
adjacent peer (Ping/Pong) and each link to a next-stage peer (`linkmeter.py`: round trip, a timed transfer, the
compute times of both ends), computes the cost of each link with Equation 1 (a link declared with `--links` keeps its
declared latency and bandwidth; the activation size of the run) and starts the flow machine. Frames for the flow
machine that arrive before it exists wait in a queue.

Both ends of a link use one cost: the upstream end's measurement, which it sends downstream (`LinkCost`); the
downstream end adopts it (the flow machine's `set_cost`). With each end's own round trip the flow machines could
disagree on a link and stall with part of the demand unplaced. `remeasure_loop` measures every next-stage link again
each `linkmeter.REMEASURE_EVERY_S` (not one to a peer on this machine: linkmeter.py); a cost that moved past the
threshold (`linkmeter.recost_threshold`) twice in a row, the same way, re-forms the flows over the link at both ends
(`FlowNode.recost`, `LinkCost(reform=True)`). The flow machine's messages to a peer go in order (driver.py `Outbox`:
one task per peer at a time): the flow machine assumes FIFO links.

A relay that becomes ready next to this node later (a newcomer placed by the leader, its Hello neither joining nor
leaving, or a relay first heard of while the links were measured) is measured and added to the running flow machine
(`add_neighbour`); a peer that crashed or left is removed (`remove_neighbour`) and the flow machines rebuild the
flows through it. A removed peer that comes back (a relay or a data node restarted with its state directory keeps its
peer id) is added again the same way: the flow machine forgets that it was removed (`add_neighbour`), and a data node
back is the previous stage of the stage-0 relays and the next stage of the last-stage relays.

With a bound K (`--flow-neighbours K`, or auto's choice, which `_choose` makes as the links are measured:
protocol/neighbourhood.py `auto_flows`) a relay links to its K cheapest next-stage relays (`LinkCost` tells them) and
its K cheapest previous-stage relays (its labels tell them: `_linked_by`), and takes the relays that chose it
(`_chose_us`, `on_link_cost`); one measured and not linked is `declined`, linked later if it chooses us or a
next-stage link goes (`_refill`).

With scaled formation (`--scaled-formation`, or auto's choice) and one data node, cost scaling (scaledformation.py)
forms the flows first and the flow machine starts holding them; its frames that come early wait in `scale_queue`.

With `--pooled-formation` and several data nodes known, pooled formation's machines run first (pooling.py) and
newcomers are added to them the same way; the flow machine starts when the node hands over. A relay that knows one
data node when its links are measured waits (`undecided`): a second data node's Hello starts pooled formation, a
neighbour's flow message the flow machine.
"""

from __future__ import annotations

import logging
import math
import random
from types import MappingProxyType
from typing import Any, Callable, Mapping

import trio

from ...protocol import messages as m
from ...protocol.cost import link_cost
from ...protocol.flow import FlowConfig, FlowNode, flows_formed
from ...protocol.neighbourhood import FLOW_NEIGHBOURS, auto_flows, nearest, refill, takes_newcomer, wide
from ...protocol.flow.poolnodes import over_links, pooled_machines
from ...protocol.flow.scaled import MAX_HELD
from ...protocol.flow.scaling import machine_for, quantized
from .pooling import Pooling
from .faults import Faults
from .scaledformation import Scaling, measure_whole
from .linkmeter import REMEASURE_EVERY_S, LinkMeter, LinkSample, recost_threshold
from .liveness import Liveness
from ..net.peers import PeerInfo, Peers
from .stage import LocalStage
from .driver import Drivers, Owner
from ..net.wire import FrameRefused, Wire, now
from .snapshots import FlowsStatus, LinkReading

log = logging.getLogger("gwtf.node")

DEFAULT_BANDWIDTH_MBPS = 1000.0  # assumed for a link whose bandwidth was neither declared nor measured
FLOW_MSGS = (m.CostAnnounce, m.RequestFlow, m.FlowReply, m.Deny, m.Withdraw, m.QueryFlows, m.FlowReport,
             m.RequestChange, m.RequestRedirect, m.MoveReply, m.Reroute, m.LaunchBid, m.Relabel, m.RelabelCost,
             m.LabelLimit)


def _seed(node_id: str) -> int:
    """A flow machine's random seed: the last bytes of its id (a peer id, or a pooled machine's)."""
    return int.from_bytes(node_id.encode()[-8:], "big")


class Flows:
    def __init__(self, wire: Wire, peers: Peers, liveness: Liveness, stage: LocalStage, drivers: Drivers,
                 links_cfg: dict[tuple[str, str], tuple[float, float]], on_changed: Callable[[], None],
                 neighbours: int | None = None, pooled: bool = False, scaled: bool | None = None,
                 faults: Faults | None = None) -> None:
        self.wire = wire
        self.faults = faults
        self.options = scaled, neighbours  # as given (None: auto, neighbourhood.py `auto_flows`): chosen at `form`
        self.scaled = bool(scaled)  # one data node: the flows are formed by cost scaling first (scaledformation.py)
        self.scaling: Scaling | None = None
        self.scale_queue: list[tuple[str, Any]] = []  # its messages that came before it started here
        self.drivers = drivers
        self.pooled = pooled  # several data nodes form their flows pooled first (pooling.py)
        self.pooling: Pooling | None = None
        self.pool_queue: list[tuple[str, m.PoolFrame]] = []  # PoolFrames that came before the pooled machines
        self.undecided = False  # a relay with pooled formation that knew one data node when its links were measured
        self.peers = peers
        self.liveness = liveness
        self.stage = stage
        self.driver = drivers.make(Owner.FLOWS, self.on_timer, in_order=wire.send_in_order, fifo=True)
        self.links_cfg = links_cfg
        self.on_changed = on_changed  # the machine ran (its flows or link costs may differ): the microbatches hear
        self.machine: FlowNode | None = None
        self.queue: list[tuple[str, Any]] = []
        self.next_costs: dict[str, float] = {}
        self.prev_costs: dict[str, float] = {}
        # the cost the upstream end of each of our incoming flow links uses (LinkCost): ours, so both ends agree
        self.agreed_costs: dict[str, float] = {}
        self.link_costs_used: dict[str, dict[str, float]] = {"next": {}, "prev": {}}  # the last cost of every link
        self.adding: set[str] = set()  # peers being added to the flow machine
        self.meter = LinkMeter(wire, peers, liveness, stage)
        self.recosts = 0  # links whose flows re-formed after a new measurement
        self.moved: dict[str, int] = {}  # peer -> the way its link's cost moved past the threshold last time
        self.neighbours = FLOW_NEIGHBOURS if neighbours is None else neighbours  # next-stage relays linked to (0: all)
        self.declined: set[str] = set()  # next-stage relays measured and not linked to (neighbourhood.py)

    # ------------------------------------------------------------------ reading
    @property
    def started(self) -> bool:
        return self.machine is not None

    def out(self) -> dict[str, dict[str, int]]:
        """Units of flow per data node and next hop (empty before the machine starts)."""
        return {d: dict(v) for d, v in self.machine.out.items()} if self.machine else {}

    def units_in(self) -> dict[str, dict[str, int]]:
        """Units of flow per data node and previous hop (empty before the machine starts)."""
        return {d: dict(v) for d, v in self.machine.inn.items()} if self.machine else {}

    def units_from(self, peer: str) -> int:
        """Units of flow `peer` hands this node now, over every data node (0 before the machine starts)."""
        return sum(v.get(peer, 0) for v in self.machine.inn.values()) if self.machine else 0

    def epochs(self) -> Mapping[str, int]:
        """Each data node's flow epoch at this node's machine, read only (empty before the machine starts)."""
        return MappingProxyType(self.machine.epoch) if self.machine else MappingProxyType({})

    def last_change(self) -> float | None:
        return self.machine.stats.last_change if self.machine else None

    def peers_with_units(self) -> set[str]:
        """The next and previous hops of this node's flows (liveness.py's `at_work`)."""
        sides = (self.machine.out, self.machine.inn) if self.machine is not None else ()
        return {p for side in sides for v in side.values() for p, n in v.items() if n}

    def units_through(self) -> int:
        """Units of flow through this node (a relay's utilization report)."""
        return sum(sum(v.values()) for v in self.machine.inn.values()) if self.machine else 0

    def _in_flow(self, peer: str) -> bool:
        if self.machine is None:  # (pooled formation: its machines' links)
            return self.pooling is not None and self.pooling.linked(peer)
        cfg = self.machine.cfg
        return peer in cfg.next_costs or peer in cfg.prev_costs or peer in cfg.peers

    def _is_relay(self, peer: str) -> bool:
        info = self.peers.get(peer)
        return info is not None and info.role == "relay"

    def _chose_us(self, peer: str) -> bool:
        """Whether the previous-stage `peer` links to this node (neighbourhood.py): a data node, a relay that said so
        (its `LinkCost`), or any relay while this node's stage is small enough for every relay to link to all of
        it."""
        if peer in self.agreed_costs or self.neighbours <= 0 or self.peers.role != "relay" or not self._is_relay(peer):
            return True
        return len(self.peers.ids("relay", self.peers.stage)) + 1 <= self.neighbours

    def _next_relays(self) -> dict[str, float]:
        costs = self.machine.cfg.next_costs if self.machine is not None else self.next_costs
        return {p: c for p, c in costs.items() if self._is_relay(p)}

    # Read-only accessors for the node's status (status.py reads none of this component's fields).
    def link_costs(self) -> dict[str, dict[str, float]]:
        """The last cost of every link, per side ("next", "prev"; peers that left stay in it): a copy."""
        return {side: dict(costs) for side, costs in self.link_costs_used.items()}

    def links_recosted(self) -> int:
        """Links whose flows re-formed after a new measurement."""
        return self.recosts

    def link_measurements(self) -> dict[str, dict]:
        """Each measured link (linkmeter.py), as status.json shows it."""
        return self.meter.snapshot()

    def link_sample(self, peer: str) -> LinkSample | None:
        """The smoothed measurement of the link to `peer` (a next-stage link), if any."""
        return self.meter.samples.get(peer)

    # ------------------------------------------------------------------ formation
    def declared(self, peer: str) -> tuple[float, float] | None:
        """(latency ms, bandwidth Mbit/s) of the link to `peer` given by `--links`, if any."""
        info = self.peers.get(peer)
        return self.links_cfg.get((self.peers.name, info.name)) if info is not None else None

    def link_cost(self, peer: str) -> float:
        """Equation 1 for the link to `peer`: declared (`--links`), else measured (`linkmeter.py`), else from the
        round trip alone and `DEFAULT_BANDWIDTH_MBPS`."""
        size = self.stage.hidden_size_mb()
        shaped = self.declared(peer)
        if shaped is not None:
            lat, bw = shaped
            return round(link_cost(0.0, 0.0, lat, lat, bw, bw, size), 3)
        measured = self.meter.cost(peer, size, DEFAULT_BANDWIDTH_MBPS)
        if measured is not None:
            return measured
        lat = (self.peers.get(peer).rtt_ms or 1.0) / 2.0
        return round(link_cost(0.0, 0.0, lat, lat, DEFAULT_BANDWIDTH_MBPS, DEFAULT_BANDWIDTH_MBPS, size), 3)

    async def _measure(self, peer: str, next_side: bool) -> None:
        """The round trip to `peer`; a next-stage link not declared is measured whole (`LinkMeter.sample`, whose
        round trips give the same figure)."""
        if next_side and self.declared(peer) is None:
            s = await self.meter.sample(peer)
            self.peers.set_rtt(peer, None if s is None else s.rtt_ms)
        else:
            self.peers.set_rtt(peer, await self.liveness.measure_rtt(peer))

    async def form(self, nxt: list[str], prv: list[str], *, joined: bool) -> bool:
        """Measure the links to `nxt` and `prv`, start the flow machine, replay what waited for it; False, with
        nothing started, when every peer of a side went while the links were measured (presumed dead: a last-stage
        relay whose data node was, for a few seconds, started a machine with no commodity and never carried a
        unit), or when a relay knows no data node (not heard of yet: the same); the caller measures again once the
        swarm is quiet.  `joined`: this node was placed by the leader, so flows may already exist around it."""
        me = self.wire.me
        self._choose(False)
        nxt, prv = await measure_whole(self._measure, me, nxt, prv, (self.peers.next_stage_ids,
                                       self.peers.prev_stage_ids) if self.scaled and not joined else None)
        self._choose(True)
        asked = {"next-stage": nxt, "previous-stage": prv}
        nxt, prv = ([p for p in side if p in self.peers or p == me] for side in (nxt, prv))
        for side, kept in (("next-stage", nxt), ("previous-stage", prv)):
            if asked[side] and not kept:
                log.info("flows: every %s peer went while the links were measured: measuring again once the swarm "
                         "is quiet", side)
                return False
        if self.peers.role == "relay" and not self.peers.data_nodes():
            log.info("flows: no data node known (not heard of yet, or presumed dead): measuring again once the swarm "
                     "is quiet")  # (a machine started now would carry no data node's units, ever)
            return False
        self.next_costs = {p: self.link_cost(p) for p in nxt}
        relays = {p: c for p, c in self.next_costs.items() if self._is_relay(p) and self.peers.role == "relay"}
        kept = nearest(relays, self.neighbours)  # (a data node links to every first-stage relay)
        self.declined = set(relays) - set(kept)
        if self.declined:
            log.info("flows: linking to the %d cheapest of %d next-stage relays", len(kept), len(relays))
        self.next_costs = {p: c for p, c in self.next_costs.items() if p not in self.declined}
        mine = nearest({p: self.agreed_costs.get(p, self.link_cost(p)) for p in prv
                        if self._is_relay(p) and self.peers.role == "relay"}, self.neighbours)
        prv = [p for p in prv if p in mine or self._chose_us(p)]  # (our labels tell those we chose: `_linked_by`)
        self.prev_costs = {p: self.agreed_costs.get(p, self.link_cost(p)) for p in prv}
        for p, c in sorted(self.next_costs.items()):
            self.driver.send(p, m.LinkCost(c))  # (through the outbox: before the labels, sent again if it fails)
        self.driver.flush()
        if self.scaled and len(self.peers.data_nodes()) == 1 and not joined:
            self._start_scaling()
        elif self.pooled and len(self.peers.data_nodes()) > 1 and not joined:
            self._start_pooling()
        elif self.pooled and not joined and self.peers.role == "relay":
            self.undecided = True  # one data node known: wait for a second one, or a neighbour's flow message
            log.info("pooled formation: one data node known: waiting for another, or a neighbour's flow message")
        else:
            self._start_machine(joined, {}, {})
        return True

    def _choose(self, final: bool) -> None:
        """Scaled formation and K, as given or auto's (`wide`; the data node's is `final`, after measuring)."""
        relay, data = self.peers.role == "relay", len(self.peers.data_nodes())
        st = [i.stage for i in self.peers.infos() if i.role == "relay" and i.stage >= 0] + [self.peers.stage] * relay
        is_wide = wide(data, len(st), len(set(st)), half=relay or not final)
        self.scaled, self.neighbours = auto_flows(*self.options, is_wide)
        self.scaled |= relay and self.options[0] is None and data == 1 and not self.pooled  # (the data node decides)
        if final:
            log.info("flows: %s formation, K = %d (0: every link; %d relays of %d stages known)",
                     "scaled" if self.scaled else "label-wave", self.neighbours, len(st), len(set(st)))

    def _commodities(self) -> tuple[str, ...]:
        """The data nodes known, and scaled formation's even if presumed dead now (it comes back: `_sides`)."""
        return tuple(dict.fromkeys([*self.peers.data_nodes(), *([self.scaling.machine.data] if self.scaling else [])]))

    def _config(self, joined: bool) -> FlowConfig:
        relay = self.peers.role == "relay"
        return FlowConfig(self.wire.me, not relay, self.peers.capacity, self._commodities(),
                          self.next_costs, self.prev_costs,
                          tuple(self.peers.ids("relay", self.peers.stage)) if relay else (), joined=joined)

    def _start_pooling(self) -> None:
        """Pooled formation first (pooling.py); the flow machine starts once this node hands over."""
        me, data = self.wire.me, sorted(self.peers.data_nodes())
        demand = {d: self.peers.capacity if d == me else self.peers.get(d).capacity for d in data}
        relay = self.peers.role == "relay"
        machines = pooled_machines(me, relay, self.peers.capacity, data, demand, dict(self.next_costs),
                                   dict(self.prev_costs), tuple(self.peers.ids("relay", self.peers.stage)) if relay
                                   else (), lambda nid: random.Random(_seed(nid)))
        self.pooling = Pooling(self.wire, self.drivers, machines, self._hand_over, tuple(data))
        self.pooling.start()
        queued, self.pool_queue = self.pool_queue, []
        for peer, msg in queued:
            try:
                self.on_pool_frame(peer, msg)
            except FrameRefused as e:
                log.info("PoolFrame from %s that waited for pooled formation refused: %s", self.peers.who(peer), e)
        for info in self.peers.infos():  # a relay first heard of while the links were measured: as a newcomer
            self.on_peer_hello(info)

    def _start_scaling(self) -> None:
        """Scaled formation first (scaledformation.py); the flow machine starts once it is over."""
        cfg = quantized(self._config(False))
        caps = {p: i.capacity for p in (*cfg.next_costs, *cfg.prev_costs) if (i := self.peers.get(p)) is not None}
        peers = tuple(sorted(i.peer_id for i in self.peers.infos() if i.peer_id != self.wire.me))
        self.scaling = Scaling(self.wire, self.drivers, machine_for(cfg, caps, peers, self.peers.n_stages),
                               lambda inn, out: self._start_machine(False, inn, out), self.faults)
        self.scaling.start()
        queued, self.scale_queue = self.scale_queue, []
        for peer, msg in queued:
            self.scaling.on_message(peer, msg)
        for peer, _ in self.queue[:1]:  # a flow message came while the links were measured: no formation around
            self.scaling.flow_message(peer)

    def _hand_over(self) -> None:
        """Pooled formation is over at this node: its flow machine starts with the units homing installed here
        (those over links still linked)."""
        inn, out = self.pooling.installed()
        self._start_machine(False, over_links(inn, self.prev_costs), over_links(out, self.next_costs))

    def _start_machine(self, joined: bool, inn: dict, out: dict) -> None:
        """Start the flow machine (holding `inn` / `out`, pooled formation's units), replay what waited for it."""
        commodities = self._commodities()
        self.machine = FlowNode(self._config(joined), random.Random(_seed(self.wire.me)))
        self.machine.adopt(inn, out)
        log.info("flow machine started: next %s prev %s", self._names(self.next_costs), self._names(self.prev_costs))
        self.driver.carry(self.machine.start(now()))
        self._sync_costs()
        queued, self.queue = self.queue, []
        for peer, msg in queued:
            c = getattr(msg, "commodity", None)  # (every flow message but CostAnnounce names a commodity)
            if c is not None and c not in commodities:
                continue
            self._linked_by(peer)
            self.driver.carry(self.machine.on_message(now(), peer, msg))
        for info in self.peers.infos():  # a relay first heard of while the links were measured: as a newcomer
            self.on_peer_hello(info)
        self.on_changed()

    async def wait_formed(self) -> None:
        """A data node starts pushing once its demand is placed, or its flows stopped changing."""
        start = now()
        me = self.wire.me
        while True:
            if self.machine is None:  # (pooled formation: until this node hands over)
                await trio.sleep(0.1)
                continue
            placed = sum(self.machine.out[me].values())
            quiet = now() - self.machine.stats.last_change
            if flows_formed(placed, self.peers.capacity, quiet, now() - start):
                log.info("flows formed: %d of %d units placed after %.1f s: %s", placed, self.peers.capacity,
                         now() - start, self._names(dict(self.machine.out[me])))
                return
            await trio.sleep(0.1)

    async def remeasure_loop(self) -> None:
        """Measure every next-stage link again each `REMEASURE_EVERY_S`; re-form the flows over a link whose cost
        moved past the threshold (module doc)."""
        while True:
            await trio.sleep(REMEASURE_EVERY_S)
            if self.machine is None:
                continue
            for peer in sorted(self.machine.cfg.next_costs):
                if self.declared(peer) is not None or peer not in self.peers or self.meter.on_this_machine(peer):
                    continue
                if await self.meter.sample(peer) is None:
                    continue
                old = self.machine.cfg.next_costs.get(peer)
                if old is None:
                    continue
                new = self.link_cost(peer)
                way = recost_threshold(old, new)
                if not way or self.moved.get(peer) != way:  # (once is not enough: module doc)
                    self.moved[peer] = way
                    continue
                self.moved.pop(peer, None)
                s = self.meter.samples[peer]
                log.info("flows: link to %s re-costed %g -> %g ms (round trip %.1f ms, %s Mbit/s, compute %.1f / "
                         "%.1f ms): its flows re-form", self.peers.who(peer), old, new, s.rtt_ms,
                         "?" if s.bandwidth_mbps is None else f"{s.bandwidth_mbps:.1f}", self.stage.compute_ms(),
                         s.peer_compute_ms)
                self.recosts += 1
                self.driver.carry(self.machine.recost(now(), peer, new))
                self._sync_costs()
                self.on_changed()

    def _sync_costs(self) -> None:
        if self.machine is not None:  # (pooled formation keeps `next_costs` / `prev_costs` itself)
            self.next_costs = dict(self.machine.cfg.next_costs)
            self.prev_costs = dict(self.machine.cfg.prev_costs)
        self.link_costs_used["next"].update(self.next_costs)  # (status.json: peers that left stay in it)
        self.link_costs_used["prev"].update(self.prev_costs)

    def _names(self, costs: dict[str, float]) -> str:
        return ", ".join(f"{self.peers.who(p)}={c:g}" for p, c in sorted(costs.items()))

    # ------------------------------------------------------------------ events
    def on_message(self, peer: str, msg: Any) -> None:
        if self.machine is None:
            self.queue.append((peer, msg))
            if self.scaling is not None:
                self.scaling.flow_message(peer)  # before a first phase: no scaled formation here (scaled.py)
            elif self.undecided:  # a neighbour forms its flows per data node: so does this relay
                self.undecided = False
                log.info("pooled formation: %s forms its flows per data node: so does this node", self.peers.who(peer))
                self._start_machine(False, {}, {})
            elif self.pooling is not None and not self.pooling.holds_units():
                self.pooling.hand_over(f"{self.peers.who(peer)} handed over, and no pooled units are here")
            return
        self._linked_by(peer)
        # the machine keeps what a newcomer says until it is told to add it (add_neighbour)
        self.driver.carry(self.machine.on_message(now(), peer, msg))
        self.on_changed()

    def on_pool_frame(self, peer: str, msg: m.PoolFrame) -> None:
        """A message of pooled formation (pooling.py): one arriving before this node's pooled machines start waits for
        them; one arriving once this node handed over (or when it forms no pooled flows) is late: ignored."""
        if self.pooling is None and self.machine is None and self.pooled:
            self.pool_queue.append((peer, msg))
            return
        if self.pooling is None or self.pooling.done:
            log.debug("PoolFrame from %s after pooled formation: ignored", self.peers.who(peer))
            return
        self.pooling.on_frame(peer, msg, FLOW_MSGS)

    def on_scale_message(self, peer: str, msg: Any) -> None:
        """A message of scaled formation (scaledformation.py): one arriving before it starts here waits for it."""
        if self.scaling is not None:
            self.scaling.on_message(peer, msg)
        elif self.machine is None and self.options[0] is not False and len(self.scale_queue) < MAX_HELD:
            self.scale_queue.append((peer, msg))

    def _linked_by(self, peer: str) -> None:
        """A next-stage relay this node did not link to sends it flow messages: that relay chose this node among its
        cheapest previous-stage relays, so the link is one of both (neighbourhood.py)."""
        if peer in self.declined:
            self.declined.discard(peer)
            log.info("flows: %s links to this node: linking to it", self.peers.who(peer))
            self.wire.spawn(self._add_neighbour, peer, ("next",), True)

    def on_timer(self, key: str) -> None:
        if self.machine is not None:
            self.driver.carry(self.machine.on_timer(now(), key))
            self.on_changed()

    def on_link_cost(self, peer: str, msg: m.LinkCost) -> None:
        """The upstream end of our link says which cost it uses: ours from now on (`LinkCost`)."""
        if not math.isfinite(msg.cost) or msg.cost < 0:
            raise FrameRefused(f"LinkCost {msg.cost!r}: a link cost is finite and >= 0")
        info = self.peers.get(peer)
        if info is not None and self.peers.stage is not None and self.peers.flow_side(info.stage) != "prev":
            raise FrameRefused(f"LinkCost from {self.peers.who(peer)}, which is not upstream of this node")
        self.agreed_costs[peer] = msg.cost
        if self.pooling is not None and self.machine is None and peer in self.prev_costs:
            self.prev_costs[peer] = msg.cost
            self.pooling.on_link_cost(peer, msg)
            return
        if (self.neighbours > 0 and self._adds_links() and info is not None and not info.joining
                and not info.leaving and not self._in_flow(peer)):
            self.wire.spawn(self._add_neighbour, peer, ("prev",))  # it links to us (neighbourhood.py)
            return
        prev = self.machine.cfg.prev_costs if self.machine is not None else {}
        if peer in prev and (msg.reform or prev[peer] != msg.cost):
            log.log(logging.INFO if msg.reform else logging.DEBUG, "flows: link from %s costs %g (its measurement; "
                    "mine was %g)%s", self.peers.who(peer), msg.cost, prev[peer],
                    ": its flows re-form" if msg.reform else "")
            self.driver.carry(self.machine.on_message(now(), peer, msg))
            self._sync_costs()
            self.on_changed()

    def peer_back(self, info: PeerInfo) -> None:
        """A peer the node had forgotten is back: its flow messages are kept until its links are added again
        (`FlowNode.peer_back`); a data node back starts its flows over (its flow machine is new):
        every node forgets what it kept of that data node's waves and bids (`data_node_back`).  Its links are
        added again by `on_peer_hello`."""
        if self.machine is None:
            return
        self.machine.peer_back(now(), info.peer_id)
        if info.role == "data":
            self.driver.carry(self.machine.data_node_back(now(), info.peer_id))
            self.on_changed()

    def on_peer_hello(self, info: PeerInfo) -> None:
        """A peer ready next to us that the flow machine does not know (a newcomer, or a peer back after it was
        removed: a restarted relay or data node): add it."""
        if self.scaling is not None:
            self.scaling.hello(info.peer_id)  # (a neighbour back; at the data node, one that came late)
        if self.undecided and info.role == "data" and len(self.peers.data_nodes()) > 1:
            self.undecided = False  # a second data node: pooled formation after all
            self._start_pooling()
            return
        if not self._adds_links() or info.joining or info.leaving or self._in_flow(info.peer_id):
            return
        sides = self._sides(info)
        if sides == ("prev",) and not self._chose_us(info.peer_id):
            return  # a relay of a large stage before ours: added once its LinkCost says it links to us
        if sides == ("next",) and info.peer_id in self.declined:
            return  # measured at formation and not among the cheapest (`refill` may take it later)
        if sides:
            self.wire.spawn(self._add_neighbour, info.peer_id, sides)

    def _sides(self, info: PeerInfo) -> tuple[str, ...]:
        """Where `info` sits for this node's flow machine: a relay by its stage; a data node (one of the machine's
        commodities) is the previous stage of stage 0 and the next stage of the last stage (both in a one-stage
        run)."""
        if info.role == "relay":
            side = self.peers.flow_side(info.stage) if info.stage >= 0 else None
            return (side,) if side is not None else ()
        data = self.machine.cfg.commodities if self.machine is not None else self.pooling.data
        if info.role != "data" or self.peers.role != "relay" or info.peer_id not in data:
            return ()  # (a data node this flow machine does not carry units of is no link of it)
        last = self.peers.n_stages - 1
        return (("prev",) if self.peers.stage == 0 else ()) + (("next",) if self.peers.stage == last else ())

    async def _add_neighbour(self, peer: str, sides: tuple[str, ...], chosen: bool = False) -> None:
        """Measure the link to `peer` and add it to the flow machine on `sides`; a next-stage relay only within the
        bound (`takes_newcomer`) unless it is `chosen` (it links to us, or it refills the bound)."""
        if peer in self.adding:
            return
        self.adding.add(peer)
        try:
            if sides != ("peer",):
                await self._measure(peer, "next" in sides)
            if peer not in self.peers or self._in_flow(peer):
                return
            for side in sides:
                cost = self.link_cost(peer) if side != "peer" else 0.0
                if side == "next" and self.peers.role == "relay" and not chosen \
                        and not takes_newcomer(peer, cost, kept := self._next_relays(), self.neighbours):
                    log.info("flows: not linking to %s (cost %g): %d cheaper next-stage relays linked",
                             self.peers.who(peer), cost, len(kept))
                    self.declined.add(peer)
                    continue
                if side == "next":
                    self.declined.discard(peer)
                    self.driver.send(peer, m.LinkCost(cost))
                    self.driver.flush()
                elif side == "prev":
                    cost = self.agreed_costs.get(peer, cost)
                log.info("flows: adding %s as %s neighbour (cost %g)%s", self.peers.who(peer), side, cost,
                         "" if self.machine is not None else " to pooled formation")
                self._add_link(peer, cost, side)
            self._sync_costs()
            self.on_changed()
        finally:
            self.adding.discard(peer)

    def _adds_links(self) -> bool:
        """Whether a newcomer is added now: to the flow machine, or to pooled formation's machines until the
        node hands over (then the flow machine's start adds what they did not have)."""
        return self.machine is not None or (self.pooling is not None and not self.pooling.done)

    def _add_link(self, peer: str, cost: float, side: str) -> None:
        if self.machine is not None:
            self.driver.carry(self.machine.add_neighbour(now(), peer, cost, side))
        elif self.pooling is not None and not self.pooling.done:
            if side != "peer":
                (self.next_costs if side == "next" else self.prev_costs)[peer] = cost
            self.pooling.add_neighbour(peer, cost, side)  # (`_sync_costs` then shows the link in status.json)

    def on_peer_gone(self, peer: str, presumed: bool = True) -> None:
        self.agreed_costs.pop(peer, None)
        self.meter.samples.pop(peer, None)
        self.moved.pop(peer, None)
        self.declined.discard(peer)
        if self.machine is None:  # (pooled formation, or a relay waiting to know how it forms)
            self.next_costs.pop(peer, None)
            self.prev_costs.pop(peer, None)
            if self.pooling is not None:
                self.pooling.peer_gone(peer)
            if self.scaling is not None:
                self.scaling.peer_gone(peer, presumed)
        if self.machine is not None and self._in_flow(peer):
            was_next = peer in self.machine.cfg.next_costs
            self.driver.carry(self.machine.remove_neighbour(now(), peer))  # flows rebuilt around it
            self._sync_costs()
            self.on_changed()
            if was_next and self.peers.role == "relay":
                self._refill()

    def _refill(self) -> None:
        """Link to the cheapest next-stage relays measured and not linked, up to the bound (neighbourhood.py)."""
        known = {p: self.link_cost(p) for p in self.declined
                 if (i := self.peers.get(p)) is not None and not i.joining and not i.leaving and i.rtt_ms is not None}
        for p in sorted(refill(self._next_relays(), known, self.neighbours)):
            log.info("flows: linking to %s in place of a next-stage relay gone", self.peers.who(p))
            self.declined.discard(p)
            self.wire.spawn(self._add_neighbour, p, ("next",), True)

    def status(self) -> FlowsStatus:
        """What the status shows of the flows and links (snapshots.py): copies, built now."""
        samples = {p: LinkReading(s.rtt_ms, s.bandwidth_mbps, s.peer_compute_ms) for p, s in self.meter.samples.items()}
        return FlowsStatus(self.out(), self.units_in(), self.units_through(), dict(self.prev_costs),
                           dict(self.next_costs), self.link_costs(), self.links_recosted(), self.link_measurements(),
                           samples, dict(self.links_cfg), self.machine.progress() if self.machine else {})
