"""Moving units: Request Flow, its reply, DENY, Reroute and Withdraw, and the node's rebalancing (section V-C).

Each node keeps, per commodity, how many units it receives from each upstream
peer (`UnitState.inn`) and sends to each downstream peer (`UnitState.out`); a
relay holds at most `capacity` units.  `UnitState` also holds the requests
awaiting their reply; only this module changes it, the other mechanisms move
units and place requests through its methods (`request`, `take_in`, ...).  The downstream end of a link owns the
count of that link: every change is decided by the receiver (approve, Deny,
Reroute, approve a Withdraw) and copied by the sender when the receiver's
message arrives, so the two ends agree once messages are delivered (links
are FIFO).

A node that holds an unpaired unit (more inflow than outflow) sends Request
Flow to the neighbour behind its OUT label with the cost it expects
(`dispatch`).  The receiver approves when its IN label still has that cost,
else rejects and tells its current cost (`on_request_flow`).  On approval the
unit moves: the receiver forwards it in turn, or displaces an upstream unit
(that peer now holds an unpaired unit), or, if it cannot go on, sends DENY
upstream.  A forced Request Flow (half of an agreed move, or a retreat) is
never rejected for its cost.  A node with too much outflow (a relay: more
than its inflow; a data node: more than its demand) withdraws the unit on its
dearest downstream route (`withdraw_one`); a node over capacity hands
its dearest inflow back (`shed_one`).  Nodes wait `balance_grace_s` before
acting on an imbalance a move created, so that the matching half of the move
can arrive, and `noroute_grace_s` before handing back a unit with no route.

A request without its FlowReply is sent again every `REQUEST_RETRY_S`, and
a receiver answers a request it answered already with the same reply
(`retry_due`, `answer_again`): a daemon's frame can be lost with its
connection, and the relay whose request it was would hold its unit for good.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..effects import Effect, Send, SetTimer
from ..messages import INF, Deny, DenyReason, FlowReply, Label, Reply, RequestFlow, Reroute, Side, Withdraw
from . import announce, labels, launches, relabel, waves
from .config import FlowConfig
from .state import (ANSWERS_KEPT, EPS, MAX_REJECTS_BEFORE_WAIT, NO_LABEL, Pending, PendingKind, Step, Via, add_one,
                    as_sent, take_one)

if TYPE_CHECKING:
    from .node import FlowNode


@dataclass
class UnitState:
    """A node's units and its requests about them; the other mechanisms move units through its methods."""

    inn: dict[str, dict[str, int]]  # per commodity: units received from each upstream peer
    out: dict[str, dict[str, int]]  # per commodity: units sent on to each downstream peer
    pending: dict[int, Pending] = field(default_factory=dict)  # requests awaiting their FlowReply, by request id
    token_pending: bool = False  # the unit this node routes now is out (one at a time)
    rejects_in_row: int = 0
    next_id: int = 1  # the last request / query / move id handed out
    grace_until: float = 0.0  # no rebalancing before this: the other half of a move may be on its way
    noroute_since: dict[str, float] = field(default_factory=dict)  # an unpaired unit has had no route since then
    answered: dict[str, dict[int, FlowReply]] = field(default_factory=dict)  # per sender: its last requests' replies

    @classmethod
    def of(cls, cfg: FlowConfig) -> UnitState:
        return cls({d: {} for d in cfg.commodities}, {d: {} for d in cfg.commodities})

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def request(self, kind: PendingKind, peer: str, d: str, cost: float = 0.0) -> int:
        """A request to `peer` about a unit of `d` (Request Flow or Withdraw) awaits its FlowReply: its id."""
        rid = self.new_id()
        self.pending[rid] = Pending(kind, peer, d, cost)
        if kind is PendingKind.LAUNCH:
            self.token_pending = True
        return rid

    def add_in(self, d: str, p: str) -> None:
        add_one(self.inn[d], p)

    def take_in(self, d: str, p: str) -> bool:
        return take_one(self.inn[d], p)

    def add_out(self, d: str, j: str) -> None:
        add_one(self.out[d], j)

    def take_out(self, d: str, j: str) -> bool:
        return take_one(self.out[d], j)

    def adopt(self, inn: dict[str, dict[str, int]], out: dict[str, dict[str, int]]) -> None:
        """Start from units placed by another formation (pooled formation's homing, pool.py): per commodity, the
        units received from each upstream peer and sent on to each downstream peer."""
        for d in self.inn:
            self.inn[d] = {p: n for p, n in inn.get(d, {}).items() if n > 0}
            self.out[d] = {j: n for j, n in out.get(d, {}).items() if n > 0}

    def grace(self, until: float) -> None:
        """No rebalancing before `until` (the other half of a move may be on its way)."""
        if until > self.grace_until:
            self.grace_until = until

    def new_round(self) -> None:
        self.rejects_in_row = 0

    def drop_peer(self, peer: str, commodities) -> tuple[bool, int]:
        """`peer` is gone: its units and the requests pending with it; (whether units were sent to it, the number
        of commodities with units on the link)."""
        lost_out, links = False, 0
        for d in commodities:
            n_out = self.out[d].pop(peer, 0)
            n_in = self.inn[d].pop(peer, 0)
            lost_out = lost_out or n_out > 0
            links += 1 if n_out or n_in else 0
        for rid in [rid for rid, p in self.pending.items() if p.peer == peer]:
            if self.pending.pop(rid).kind == PendingKind.LAUNCH:
                self.token_pending = False
        self.answered.pop(peer, None)  # (a peer that comes back may have restarted: its request ids too)
        return lost_out, links


def retry_due(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Send again each request whose FlowReply has not come `REQUEST_RETRY_S` after it went (timed from the tick
    after).  Links are FIFO and reliable in the model, but a daemon's frame can be lost with its connection, and a
    node whose request is never answered holds its unit for good.  The receiver answers a request it has answered
    already with the same reply (`answer_again`), so a request sent twice moves no unit twice."""
    for rid, p in node.units.pending.items():
        if p.due(now):
            msg = Withdraw(rid, p.commodity) if p.kind is PendingKind.WITHDRAW else \
                RequestFlow(rid, p.commodity, p.cost, forced=p.kind is PendingKind.FORCED)
            eff.append(Send(p.peer, msg))
            node.stats.resend()


def answer_again(node: FlowNode, sender: str, msg: RequestFlow | Withdraw) -> list[Effect] | None:
    """The reply already given to `sender`'s request `msg` (sent again: `retry_due`), or None."""
    reply = node.units.answered.get(sender, {}).get(msg.req_id)
    if reply is None:
        return None
    node.stats.answer_again()
    return [Send(sender, reply)]


def note_answer(node: FlowNode, sender: str, msg: RequestFlow | Withdraw, eff: list[Effect]) -> None:
    """Keep the FlowReply this node gave `sender`'s request (the last `ANSWERS_KEPT` per sender)."""
    for e in eff:
        if type(e) is Send and e.to == sender and type(e.msg) is FlowReply and e.msg.req_id == msg.req_id:
            kept = node.units.answered.setdefault(sender, {})
            kept[msg.req_id] = e.msg
            if len(kept) > ANSWERS_KEPT:
                del kept[next(iter(kept))]
            return


def quiet(node: FlowNode) -> bool:
    return not node.units.pending and all(node.imbalance(d) == 0 for d in node.cfg.commodities)

def act(node: FlowNode, now: float, eff: list[Effect]) -> None:
    if node.cfg.is_data:
        d = node.cfg.node_id
        if node.outflow_committed(d) > node.launch.demand:
            withdraw_one(node, now, d, eff)  # more out than its demand (relabel.py): the dearest unit back
            return
        launches.maybe_launch(node, now, eff)
        return
    if node.relabel:
        relabel.relabel_costs(node, eff)
    if now < node.units.grace_until:
        if any(node.imbalance(d) for d in node.cfg.commodities):
            eff.append(SetTimer("balance", node.units.grace_until))
        return
    if node.units.token_pending or (node.units.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT and not node.wave.walk):
        return
    if node.used() > node.cfg.capacity:
        shed_one(node, now, eff)
        return
    for d in node.cfg.commodities:
        imb = node.imbalance(d)
        if imb > 0:
            dispatch(node, now, d, eff)
            return
        if imb < 0:
            withdraw_one(node, now, d, eff)
            return

def dispatch(node: FlowNode, now: float, d: str, eff: list[Effect]) -> None:
    """Move one unpaired unit along the OUT label: forward it, or DENY it back."""
    dec = node.labels.dec_out.get(d)
    if waves.walking(node) and waves.gate(node, now, d, dec, eff):
        return
    if node.units.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT:
        return
    if dec is None:
        # no route known (yet: a new wave may be on its way): wait a little, then hand it back upstream
        since = node.units.noroute_since.setdefault(d, now)
        if now < since + node.cfg.noroute_grace_s:
            eff.append(SetTimer("balance", since + node.cfg.noroute_grace_s))
            return
        ups = sorted(p for p, n in node.units.inn[d].items() if n > 0)
        if not ups:
            return
        dec = (Via.BACK, ups[0])
    node.units.noroute_since.pop(d, None)
    kind, peer = dec
    if kind == Via.FORWARD:
        cost = node.labels.lin[d][peer].cost
        rid = node.units.request(PendingKind.LAUNCH, peer, d, cost)
        eff.append(Send(peer, RequestFlow(rid, d, cost)))
    else:
        take_one(node.units.inn[d], peer)
        node.changed(now)
        eff.append(Send(peer, Deny(d, DenyReason.NO_ROUTE)))
        waves.log_step(node, d, (Step.BACK, peer))
        announce.refresh_all(node, eff)
        act(node, now, eff)

def shed_one(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Over capacity (an agreed move raced with new work): hand the dearest inflow back."""
    cands = [(node.cfg.prev_costs[p], d, p) for d in node.cfg.commodities for p, n in node.units.inn[d].items() if n > 0]
    _, d, p = max(sorted(cands))
    take_one(node.units.inn[d], p)
    node.changed(now)
    eff.append(Send(p, Deny(d, DenyReason.NO_ROUTE)))
    announce.refresh_all(node, eff)
    act(node, now, eff)

def withdraw_one(node: FlowNode, now: float, d: str, eff: list[Effect]) -> None:
    """Too much outflow: take back the unit on the dearest downstream route."""
    def dearness(j: str) -> float:
        lab = node.labels.lin[d].get(j)
        return node.cfg.next_costs[j] + (lab.cost if lab is not None else INF)
    cands = [j for j, n in node.units.out[d].items() if n > 0]
    if not cands:
        return
    j = max(sorted(cands), key=dearness)
    rid = node.units.request(PendingKind.WITHDRAW, j, d)
    eff.append(Send(j, Withdraw(rid, d)))

def on_request_flow(node: FlowNode, now: float, sender: str, msg: RequestFlow, eff: list[Effect]) -> None:
    d = msg.commodity
    cfg = node.cfg
    if sender not in cfg.prev_costs or d not in node.units.inn:
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NOT_LINKED, None)))
        return
    if cfg.is_data:
        if d != cfg.node_id:
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY, None)))
            return
        add_one(node.units.inn[d], sender)  # the sink always takes its own units
        node.changed(now)
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
        if not msg.forced:
            launches.settled(node, now, eff, arrived=True)
        return
    if msg.forced and waves.walk_back(node, now, sender, msg, eff):
        return
    if msg.forced:
        add_one(node.units.inn[d], sender)
        node.changed(now)
        node.units.grace(now + cfg.balance_grace_s)
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
        announce.refresh_all(node, eff)
        return
    lab = node.labels.my_in.get(d, NO_LABEL)
    if lab.cost == INF:
        node.stats.reject()
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY, as_sent(node, lab, d))))
        return
    if abs(lab.cost - msg.expected_cost) > EPS:
        node.stats.reject()
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.COST_CHANGED, as_sent(node, lab, d))))
        return
    dec = node.labels.dec_in[d]
    if dec is not None and dec[0] == Via.BACK and dec[1] == sender:
        # taking the unit would displace the requester's own unit: a no-op it must not retry
        node.stats.reject()
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY,
                                       as_sent(node, Label(d, Side.IN, INF, ()), d))))
        return
    add_one(node.units.inn[d], sender)
    node.changed(now)
    eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
    if dec is not None and dec[0] == Via.BACK:
        take_one(node.units.inn[d], dec[1])
        eff.append(Send(dec[1], Deny(d, DenyReason.DISPLACED)))
        waves.log_step(node, d, (Step.THROUGH, sender, dec[1]))
    elif dec is not None and dec[0] == Via.CROSS:
        p, b = dec[1], dec[2]
        if take_one(node.units.inn[b], p):
            relabel.crossed(node)
            eff.append(Send(p, Deny(b, DenyReason.DISPLACED)))
            relabel.relabel_down(node, now, b, d, eff)
    else:
        waves.log_step(node, d, (Step.IN, sender))
    announce.refresh_all(node, eff)

def on_flow_reply(node: FlowNode, now: float, sender: str, msg: FlowReply, eff: list[Effect]) -> None:
    pend = node.units.pending.pop(msg.req_id, None)
    if pend is None:
        node.stats.ignore()
        return
    d = pend.commodity
    if pend.kind == PendingKind.LAUNCH:
        node.units.token_pending = False
    if msg.outcome == Reply.APPROVED:
        node.units.rejects_in_row = 0
        if pend.kind == PendingKind.WITHDRAW:
            take_one(node.units.out[d], sender)
        else:
            first = node.units.out[d].get(sender, 0) == 0
            add_one(node.units.out[d], sender)
            if node.cfg.is_data and pend.kind == PendingKind.LAUNCH:
                launches.approved(node)
            elif pend.kind == PendingKind.LAUNCH:
                waves.log_step(node, d, (Step.FORWARD, sender))
            if first:
                announce.refresh(node, [d], eff, {d: {sender}})
        node.changed(now)
        return
    if pend.kind == PendingKind.WITHDRAW:
        return  # already handed back by the peer: its Deny/Reroute adjusts our count
    if pend.kind == PendingKind.LAUNCH and node.cfg.is_data and node.waves:
        launches.rejected(node)
    node.units.rejects_in_row += 1
    if msg.current is not None:
        labels.ingest(node, sender, msg.current)
    else:
        labels.unusable(node, d, sender)
    announce.refresh(node, [d], eff)
    if pend.kind == PendingKind.LAUNCH and node.cfg.is_data and node.waves and node.cfg.same_wave_launches \
            and d == node.cfg.node_id and node.launch.wave_launches > 0:
        # a later launch of this wave found its first hop dearer: another tight first hop, else a new wave
        if waves.tight(node, d) and node.units.rejects_in_row < MAX_REJECTS_BEFORE_WAIT:
            launches.relaunch(node, now, at_once=True)
        else:
            launches.new_wave(node, now, eff)

def on_deny(node: FlowNode, now: float, sender: str, msg: Deny, eff: list[Effect]) -> None:
    d = msg.commodity
    if d not in node.units.out or not take_one(node.units.out[d], sender):
        node.stats.ignore()
        return
    node.changed(now)
    if node.cfg.is_data:
        launches.settled(node, now, eff)
    elif waves.walking(node):
        waves.denied(node, d, sender, msg.reason)
    announce.refresh(node, [d], eff)

def on_reroute(node: FlowNode, now: float, sender: str, msg: Reroute, eff: list[Effect]) -> None:
    d = msg.commodity
    if d not in node.units.out or not take_one(node.units.out[d], sender):
        node.stats.ignore()
        return
    node.changed(now)
    if msg.to in node.cfg.next_costs:
        rid = node.units.request(PendingKind.FORCED, msg.to, d)
        eff.append(Send(msg.to, RequestFlow(rid, d, 0.0, forced=True)))
    node.units.grace(now + node.cfg.balance_grace_s)

def on_withdraw(node: FlowNode, now: float, sender: str, msg: Withdraw, eff: list[Effect]) -> None:
    d = msg.commodity
    if d in node.units.inn and take_one(node.units.inn[d], sender):
        node.changed(now)
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
        if not node.cfg.is_data:
            node.units.grace(now + node.cfg.balance_grace_s)
            if sender in node.cfg.commodities:
                relabel.refused(node, sender)  # a data node gives a unit back: it is at its demand
            announce.refresh_all(node, eff)
    else:
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_SUCH_FLOW, None)))
