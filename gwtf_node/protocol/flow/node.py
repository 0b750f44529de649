"""The flow machine's entry points: `FlowNode`, handed `now`, an event and its seeded RNG, returns effects.

Every node only knows its own links (to the previous and the next stage, given
by discovery), its same-stage peers, and what they tell it.  The mechanisms
live in their own modules, each owning its part of the state (a dataclass
held here): labels (labels.py), their announcement (announce.py), moving units
(units.py), the data node's launches and label waves (launches.py), several
units per wave and retreats (waves.py), ordered launches (bids.py),
relabelling and cross displacement (relabel.py), improvement moves and
annealing (moves.py).

Membership changes.  The daemon (or the simulator, sim/flowchurn.py) tells a
machine about its neighbours coming and going; the flows are re-formed by the
machines with their messages (units.py), never recomputed globally.

* `add_neighbour(now, peer, cost, side)`, side "next" / "prev" / "peer": link
  `peer` with cost d(self, peer) (adding a known one updates its cost).  A new
  "prev" neighbour is sent this node's current IN labels (it joined after they
  were announced), stamped with the current wave; a label a newcomer sent
  before we were told about it is kept (`stash`, bounded) and used when it is
  added (during formation, at the next wave: waves.py `defer`).  Adding only
  lowers labels, so a newcomer's capacity counts in the current wave.  A node
  placed into a run in flight is started with `FlowConfig.joined`.
* `remove_neighbour(now, peer)`: `peer` crashed or left; it is forgotten on
  every side.  Units this node sent to it are unpaired again and re-routed
  along the OUT label (DENY upstream when there is no route); units it sent to
  this node are withdrawn downstream (Withdraw, recursively to the sink), so
  that the downstream end, which owns the count, agrees.  Requests and moves
  pending with it are dropped, its later messages ignored.  A data node that
  loses first hops re-places its demand after a new wave.
* `peer_back(now, peer)`: a removed peer can be reached again; its messages
  are kept until it is added (a label it announces while this node still
  measures the link would otherwise be lost for good).
* `data_node_back(now, d)`: the data node of commodity `d` restarted (it
  keeps its id; its new flow machine numbers its label waves and bids from
  the start again): what this node kept of `d`'s waves and bids is
  forgotten, so that the new ones are taken instead of ignored as old, and
  its labels are kept until its links are added again (`add_neighbour`).
* `set_cost(now, peer, cost)`: d(self, peer) measured again.  Both ends of a
  link must hold the same cost: a unit's forward edge (the upstream end's
  `next_costs`) and its residual backward edge (the downstream end's
  `prev_costs`) cancel only then; the daemon makes the downstream end adopt
  the upstream end's cost (`LinkCost`, handled here as a flow message).
* `recost(now, peer, cost)`: the upstream end's measurement of the link to
  `peer` moved past the re-costing threshold (the daemon's link meter).  A new
  cost alone moves no unit (the labels change, the units placed stay: a link
  that became ten times dearer keeps its flow), so both ends re-form the flows
  over the link: the upstream end sends `LinkCost(cost, reform=True)` ahead
  of its other messages to `peer`, and each end removes the link and adds it
  again at the new cost (`remove_neighbour`, `add_neighbour`): the units on it
  are withdrawn downstream and re-routed upstream, the data node re-places
  them with a new wave, and the link is one candidate among the others at its
  new cost.  Measured on settings 1 and 5 (`tests/protocol/test_flow_membership.py`):
  the re-formed flows end within a few percent of the new optimum, where
  `set_cost` alone, or with the improvement moves after it, left 9-84 % above.

Re-routing on the labels at hand forms a maximum flow but not always a
cheapest one (the units of a crashed relay race each other on old labels), so
after a change the neighbours (and a joiner) run Request Redirect / Request
Change for `change_improve_rounds` (moves.py).
"""

from __future__ import annotations

import random
from dataclasses import replace

from ..effects import Effect, Send, SetTimer
from ..messages import (
    INF, CostAnnounce, Deny, FlowReply, FlowReport, LabelLimit, LaunchBid, LinkCost, MoveReply, QueryFlows, Relabel,
    RelabelCost, RequestChange, RequestFlow, RequestRedirect, Reroute, Side, Withdraw,
)
from . import announce, bids, cycles, labels, launches, limits, moves, relabel, units, waves
from .announce import AnnounceState
from .bids import BidState
from .config import FlowConfig
from .cycles import CycleState
from .labels import LabelState
from .launches import LaunchState
from .limits import LimitState
from .moves import Annealer, MoveState
from .relabel import RelabelState
from .state import SIDES, FlowStats, PendingKind, as_sent, marked, total
from .units import UnitState
from .waves import WaveState


class FlowNode:
    """One node's flow machine: handed `now`, an event and its seeded RNG, returns effects.

    It composes the mechanisms' state objects (each mutated only by its own module) and keeps the node's
    links (`cfg`), the peers it removed and the time of the event being handled."""

    def __init__(self, config: FlowConfig, rng: random.Random) -> None:
        self.cfg = config
        self.rng = rng
        self.data_prev = tuple(p for p in config.prev_costs if p in config.commodities)  # data nodes upstream
        self.removed: set[str] = set()  # peers removed (and not added again): their messages are ignored
        self.now = 0.0  # the time of the event being handled
        self.stats = FlowStats()
        self.waves = config.waves if config.waves is not None else len(config.commodities) <= 1
        self.ordered = not self.waves and (config.ordered_launches if config.ordered_launches is not None
                                           else len(config.commodities) > 1)
        self.relabel = len(config.commodities) > 1 if config.relabel is None else config.relabel
        self.cross = self.relabel and config.cross_displace
        self.improving = config.improve if config.improve is not None else len(config.commodities) > 1
        self.limited = self.waves and config.label_limits
        # the mechanisms' own state, one object each
        self.labels = LabelState.of(config)
        self.units = UnitState.of(config)
        self.announcer = AnnounceState()
        self.wave = WaveState()
        self.launch = LaunchState(demand=config.capacity if config.is_data else 0)
        self.bid = BidState()
        self.cycles = CycleState()
        self.relabelling = RelabelState()
        self.limits = LimitState()
        self.moves = MoveState(Annealer(config.t0, *config.cooling))

    # Read-only views for the drivers, the simulator and the tests (the owners' objects, not copies).
    inn = property(lambda self: self.units.inn, doc="units received, per commodity and upstream peer")
    out = property(lambda self: self.units.out, doc="units sent on, per commodity and downstream peer")
    pending = property(lambda self: self.units.pending, doc="requests awaiting their FlowReply, by id")
    token_pending = property(lambda self: self.units.token_pending, doc="the unit this node routes now is out")
    grace_until = property(lambda self: self.units.grace_until, doc="no rebalancing before this")
    lin = property(lambda self: self.labels.lin, doc="next-stage IN labels, per commodity and peer")
    lout = property(lambda self: self.labels.lout, doc="previous-stage OUT labels, per commodity and peer")
    my_in = property(lambda self: self.labels.my_in, doc="this node's IN label per commodity")
    my_out = property(lambda self: self.labels.my_out, doc="this node's OUT label per commodity")
    dec_in = property(lambda self: self.labels.dec_in, doc="the route behind `my_in`")
    dec_out = property(lambda self: self.labels.dec_out, doc="the route behind `my_out`")
    epoch = property(lambda self: self.labels.epoch, doc="the current label wave per commodity")
    cache = property(lambda self: self.labels.cache, doc="the cached label candidates (labels.py)")
    change_moves_until = property(lambda self: self.moves.change_until, doc="moves after a change until then")

    def new_id(self) -> int:
        return self.units.new_id()

    def used(self) -> int:
        """Units this node receives, over every commodity (at most `capacity` for a relay)."""
        n = 0
        for v in self.units.inn.values():
            n += sum(v.values())
        return n

    def changed(self, now: float) -> None:
        self.stats.changed(now)

    def outflow_committed(self, d: str) -> int:
        """Units of `d` sent on, counting requests still out (a Request Flow as one more, a Withdraw as one less)."""
        n = total(self.units.out[d])
        for p in self.units.pending.values():
            if p.commodity == d:
                n += 1 if p.kind != PendingKind.WITHDRAW else -1
        return n

    def imbalance(self, d: str) -> int:
        """Units held but not passed on (> 0) or passed on but not held (< 0)."""
        if self.cfg.is_data:
            return 0
        return total(self.units.inn[d]) - self.outflow_committed(d)

    def progress(self) -> dict:
        """What the machine waits for, for an operator (the daemon's status.json `flow_machine`): per commodity its
        wave, its OUT label's cost (None: no route), whether the wave is a formation wave here, a unit held for a new
        wave, and the seconds until a unit may move on (waves.py `gate`; counted from the machine's last event); at
        a data node with waves also its launches: units placed of its demand, a launch out, the next launch's wait
        (None: a new wave first), the stuck waves of the launch out, whether it re-formed.  `sent_again` and
        `answered_again` count this node's requests sent again and requests it answered again (units.py
        `retry_due`; the node's, in every commodity's entry)."""
        now, w = self.now, self.wave

        def left(t: float) -> float | None:
            return None if t == INF else round(max(0.0, t - now), 3)

        out: dict = {}
        for d in self.cfg.commodities:
            lab = self.labels.my_out.get(d)
            out[d] = {"wave": self.labels.epoch[d], "out_cost": None if lab is None or lab.cost == INF else lab.cost,
                      "formation": marked(self, d), "held": d in w.hold, "moves_in_s": left(w.still_at.get(d, 0.0)),
                      "sent_again": self.stats.sent_again, "answered_again": self.stats.answered_again}
        if self.cfg.is_data and self.waves:
            d, la = self.cfg.node_id, self.launch
            out[d]["launches"] = {"demand": la.demand, "placed": total(self.units.out[d]),
                                  "out": max(la.pending, 0) + int(self.units.token_pending),
                                  "next_in_s": left(la.next_at), "stuck_waves": la.stuck_waves, "recall": la.recall,
                                  "reformed": w.reformed}
        return out

    # Calls against the modules' import order: labels, launches, waves and units import announce, so announce
    # reaches the mechanisms above it through the node (the package has no import cycle).
    def compute_label(self, d: str) -> None:
        labels.compute(self, d)

    def fold_in_label(self, d: str, j: str) -> int:
        return labels.fold_in(self, d, j)

    def fold_out_label(self, d: str) -> bool:
        return labels.fold_out(self, d)

    def out_label_changed(self, lab) -> None:
        launches.out_changed(self, lab)

    def labels_lowered(self, d: str) -> None:
        waves.labels_lowered(self, d)

    def act_on_units(self, now: float, eff: list[Effect]) -> None:
        units.act(self, now, eff)

    def adopt(self, inn: dict[str, dict[str, int]], out: dict[str, dict[str, int]]) -> None:
        """Before `start`: hold the units another formation placed (pooled formation's homing, pool.py) instead of
        none; the labels are computed over them at `start`, and the data node launches only what they leave of its
        demand.  Those units are a maximum flow (the pool's) but no successive-shortest-path result of any one
        commodity, so their residual network may hold a negative cycle: the data node marks no wave (as after a
        removal: a hand-back costs 0, waves.py `free_back`) and a relay crosses no more (relabel.py `adopted`)."""
        self.units.adopt(inn, out)
        if self.cfg.is_data:
            waves.reformed(self)  # (its first wave, at `start`, is unmarked)
        else:
            relabel.adopted(self)

    def start(self, now: float) -> list[Effect]:
        eff: list[Effect] = []
        self.now = now
        if self.cfg.is_data:
            launches.new_wave(self, now, eff)  # the first wave: the data node announces its sink label
        else:
            announce.refresh_all(self, eff)
        if self.cfg.joined and not self.cfg.is_data:
            moves.after_change(self, now)
        phase = self.rng.uniform(0.0, self.cfg.round_s)
        eff.append(SetTimer("tick", now + phase))
        return eff

    def on_timer(self, now: float, key: str) -> list[Effect]:
        eff: list[Effect] = []
        self.now = now
        if key == "announce":
            announce.flush(self, eff)
        if key == "limits":
            limits.on_timer(self, eff)
        if key == "relabelcost":
            relabel.send_costs(self, eff)
        if key == "stuck" and self.cfg.is_data:
            launches.maybe_stuck(self, now, eff)
        if key == "recall" and self.cfg.is_data:
            launches.open_recall(self, eff)
        if key == "tick":
            eff.append(SetTimer("tick", now + self.cfg.round_s))
            if self.cfg.is_data:
                launches.note_sink(self, now, eff)
                launches.maybe_lost_settlement(self, now, eff)
                launches.maybe_retry_wave(self, now, eff)
                cycles.tick(self, now, eff)
            self.units.new_round()
            due = waves.undefer_due(self, now)
            if due:
                self._undefer(now, due, eff)
            moves.expire(self, now)  # a move whose peer never answered is given up
            units.retry_due(self, now, eff)
            if (self.improving or now < self.moves.change_until) and not self.cfg.is_data \
                    and self.moves.current is None and units.quiet(self):
                moves.start_query(self, now, eff)
            if self.relabel and not self.cfg.is_data and self.data_prev and self.moves.current is None \
                    and units.quiet(self):
                relabel.maybe_relabel(self, now, eff)
        units.act(self, now, eff)
        return eff

    def on_message(self, now: float, sender: str, msg) -> list[Effect]:
        self.now = now
        if type(msg) is CostAnnounce and len(msg.labels) == 1 and not self.cfg.is_data:
            # the bulk of a wave: one next-stage IN label of the current wave, most of which change nothing
            # here (what labels.on_announce does, without its generality)
            if self.limited:
                lab = msg.labels[0]
                if lab.side is Side.IN and sender in self.cfg.next_costs:
                    limits.note(self, lab.commodity, sender, lab.cost)
            r = labels.wave_label(self, sender, msg.labels[0])
            if r is not None:
                d = msg.labels[0].commodity
                eff: list[Effect] = []
                if r == 1:
                    if self.limited:
                        limits.useless(self, d, sender, msg.labels[0], eff)
                    return eff
                announce.refresh(self, (d,), eff, folds={d: []} if r == 2 else None, narrow=True)
                units.act(self, now, eff)
                return eff
        if type(msg) is LinkCost:
            return self._on_link_cost(now, sender, msg)
        eff = []
        handler = HANDLERS.get(type(msg))
        if handler is None or sender in self.removed:
            self.stats.ignore()  # unknown, or from a removed peer (sent before it was removed)
            return eff
        request = type(msg) is RequestFlow or type(msg) is Withdraw
        if request and (again := units.answer_again(self, sender, msg)) is not None:
            return again  # a request sent again: its reply was lost (units.py `retry_due`)
        if not handler(self, now, sender, msg, eff):  # (True: the message changed nothing)
            units.act(self, now, eff)
        if request:
            units.note_answer(self, sender, msg, eff)
        return eff

    def add_neighbour(self, now: float, peer: str, cost: float, side: str) -> list[Effect]:
        """`peer` is now linked to this node as a next-stage ("next"), previous-stage ("prev") or same-stage
        ("peer") neighbour; for "next"/"prev" `cost` is d(self, peer).  Adding a known neighbour again only
        updates its cost.  See "Membership changes" in the module doc."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}")
        eff: list[Effect] = []
        self.now = now
        cfg = self.cfg
        if peer == cfg.node_id:
            return eff
        self.removed.discard(peer)
        known = peer in (cfg.peers if side == "peer" else cfg.next_costs if side == "next" else cfg.prev_costs)
        grows = not known and waves.forming(self)  # a newcomer during formation keeps it (waves.defer)
        if not grows:
            waves.membership_changed(self)
        elif side == "next":
            waves.defer(self, peer)
        cycles.membership_changed(self)
        if side == "peer":
            if peer not in cfg.peers:
                self.cfg = replace(cfg, peers=cfg.peers + (peer,))
        if not cfg.is_data:
            moves.after_change(self, now)  # flows may now be cheaper elsewhere (see "Membership changes")
        if side == "peer":
            return eff
        costs = dict(cfg.next_costs if side == "next" else cfg.prev_costs)
        costs[peer] = float(cost)
        self.cfg = replace(cfg, **{f"{side}_costs": costs})
        self.data_prev = tuple(p for p in self.cfg.prev_costs if p in self.cfg.commodities)
        labels.take_stashed(self, peer, Side.IN if side == "next" else Side.OUT)
        if side == "prev" and not known:
            # the newcomer needs our IN labels to route through us; they went out before it was there
            labs = []
            for d in cfg.commodities:
                lab = self.labels.my_in.get(d)
                if lab is None or lab.cost == INF or (peer in cfg.commodities and peer != d):
                    continue
                labs.append(as_sent(self, lab, d))
                if self.limited:
                    limits.gave(self, d, (peer,), lab.cost)
            if labs:
                eff.append(Send(peer, CostAnnounce(tuple(labs))))
        if cfg.is_data and not grows:
            launches.reform(self, now, eff)  # no more formation waves (waves.py)
        announce.refresh_all(self, eff)
        units.act(self, now, eff)
        return eff

    def _undefer(self, now: float, peers: list[str], eff: list[Effect]) -> None:
        """Newcomers whose labels waited for a new wave that did not come (waves.py `defer`): take in the labels
        they sent before they were added, unless one they sent since (of that wave or a newer one) is held."""
        for peer in peers:
            labels.take_stashed(self, peer, Side.IN, only_newer=True)
        announce.refresh_all(self, eff)
        units.act(self, now, eff)

    def peer_back(self, now: float, peer: str) -> None:
        """`peer`, removed, can be reached again (a partition healed, or it restarted): what it sends from now on
        is new, so its labels are kept (`stash`) until it is added again instead of ignored as sent before its
        removal.  Without this, a relay back from a partition that announced its labels to a data node which
        had not added it yet (its link still being measured) was never used again: its announcement was
        dropped, and it does not repeat one.  (A restarted data node also needs `data_node_back`.)"""
        self.now = now
        self.removed.discard(peer)

    def data_node_back(self, now: float, d: str) -> list[Effect]:
        """The data node of commodity `d` restarted: its waves and bids count from the start again (module doc,
        "Membership changes").  Its units were unpaired when it was removed; nothing else of `d` is kept."""
        eff: list[Effect] = []
        self.now = now
        if d not in self.labels.epoch or d == self.cfg.node_id:
            return eff
        self.removed.discard(d)  # its labels are kept (`stash`) until it is linked again (`add_neighbour`)
        labels.data_node_back(self, d)
        waves.forget(self, d)
        announce.forget(self, d)
        bids.data_node_back(self, d)
        relabel.forget(self, d)
        announce.refresh(self, (d,), eff)
        units.act(self, now, eff)
        return eff

    def set_cost(self, now: float, peer: str, cost: float) -> list[Effect]:
        """d(self, peer) was measured again.  Within a label wave a rise is not announced (announce.py)."""
        eff: list[Effect] = []
        self.now = now
        cfg = self.cfg
        changes = {}
        if peer in cfg.next_costs:
            changes["next_costs"] = {**cfg.next_costs, peer: float(cost)}
        if peer in cfg.prev_costs:
            changes["prev_costs"] = {**cfg.prev_costs, peer: float(cost)}
        if changes:
            self.cfg = replace(cfg, **changes)
            announce.refresh_all(self, eff)
            units.act(self, now, eff)
        return eff

    def recost(self, now: float, peer: str, cost: float) -> list[Effect]:
        """The link to next-stage `peer` now costs `cost` and its flows re-form (module doc); the first effect
        tells `peer` (`LinkCost(cost, reform=True)`).  Nothing happens for a peer that is no next hop."""
        if peer not in self.cfg.next_costs:
            return []
        eff: list[Effect] = [Send(peer, LinkCost(float(cost), reform=True))]
        eff += self.remove_neighbour(now, peer)
        eff += self.add_neighbour(now, peer, cost, "next")
        return eff

    def _on_link_cost(self, now: float, sender: str, msg: LinkCost) -> list[Effect]:
        """The upstream end's cost of our link: adopted (`set_cost`), or the flows over it re-form."""
        if sender not in self.cfg.prev_costs:
            return []
        if msg.reform:
            eff = self.remove_neighbour(now, sender)
            eff += self.add_neighbour(now, sender, msg.cost, "prev")
            return eff
        if self.cfg.prev_costs[sender] == msg.cost:
            return []
        return self.set_cost(now, sender, msg.cost)

    def remove_neighbour(self, now: float, peer: str) -> list[Effect]:
        """`peer` crashed or left: forget it on every side.  Units this node sent to it are unpaired again and
        re-routed; units it sent to this node are withdrawn downstream; requests and moves pending with it are
        dropped; its later messages are ignored.  See "Membership changes" in the module doc."""
        eff: list[Effect] = []
        self.now = now
        cfg = self.cfg
        labels.unstash(self, peer)
        waves.undefer(self, peer)
        bids.neighbour_removed(self, peer)
        relabel.forget(self, peer)
        if peer not in cfg.next_costs and peer not in cfg.prev_costs and peer not in cfg.peers:
            return eff
        self.removed.add(peer)
        waves.membership_changed(self)
        if cfg.is_data:
            waves.reformed(self)  # the wave it starts below is no formation wave
        cycles.membership_changed(self)
        self.cfg = replace(cfg, next_costs={p: c for p, c in cfg.next_costs.items() if p != peer},
                           prev_costs={p: c for p, c in cfg.prev_costs.items() if p != peer},
                           peers=tuple(p for p in cfg.peers if p != peer))
        self.data_prev = tuple(p for p in self.cfg.prev_costs if p in self.cfg.commodities)
        lost_out, links = self.units.drop_peer(peer, cfg.commodities)
        for _ in range(links):  # one flow change per commodity with units on the link
            self.changed(now)
        labels.drop_peer(self, peer)
        announce.drop_peer(self, peer)
        limits.drop_peer(self, peer)
        moves.neighbour_removed(self, peer)
        if not cfg.is_data:
            moves.after_change(self, now)
        if cfg.is_data:
            if lost_out:
                launches.first_hop_lost(self)  # the unit in flight may have been with it: no settlement will come
            if self.waves:
                launches.new_wave(self, now, eff)  # labels rose: recompute them all (the demand is re-placed on it)
                units.act(self, now, eff)
                return eff
            if lost_out:
                launches.relaunch(self, now)
        announce.refresh_all(self, eff)
        units.act(self, now, eff)
        return eff


HANDLERS = {
    CostAnnounce: labels.on_announce,
    RequestFlow: units.on_request_flow,
    FlowReply: units.on_flow_reply,
    Deny: units.on_deny,
    Reroute: units.on_reroute,
    Withdraw: units.on_withdraw,
    QueryFlows: moves.on_query,
    FlowReport: moves.on_report,
    RequestChange: moves.on_request_change,
    RequestRedirect: moves.on_request_redirect,
    MoveReply: moves.on_move_reply,
    LaunchBid: bids.on_launch_bid,
    Relabel: relabel.on_relabel,
    RelabelCost: relabel.on_relabel_cost,
    LabelLimit: limits.on_limit,
}
