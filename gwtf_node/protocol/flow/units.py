"""Moving units: Request Flow, its reply, DENY, Reroute and Withdraw, and the node's rebalancing (section V-C).

Each node keeps, per commodity, how many units it receives from each upstream
peer (`FlowNode.inn`) and sends to each downstream peer (`FlowNode.out`); a
relay holds at most `capacity` units.  The downstream end of a link owns the
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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..effects import Effect, Send, SetTimer
from ..messages import INF, Deny, DenyReason, FlowReply, Label, Reply, RequestFlow, Reroute, Side, Withdraw
from . import announce, labels, launches, relabel, waves
from .state import EPS, MAX_REJECTS_BEFORE_WAIT, NO_LABEL, Pending, PendingKind, Step, Via, add_one, take_one, stamped

if TYPE_CHECKING:
    from .node import FlowNode


def quiet(node: FlowNode) -> bool:
    return not node.pending and all(node.imbalance(d) == 0 for d in node.cfg.commodities)

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
    if now < node.grace_until:
        if any(node.imbalance(d) for d in node.cfg.commodities):
            eff.append(SetTimer("balance", node.grace_until))
        return
    if node.token_pending or (node.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT and not node.wave.walk):
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
    dec = node.dec_out.get(d)
    if waves.walking(node) and waves.gate(node, now, d, dec, eff):
        return
    if node.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT:
        return
    if dec is None:
        # no route known (yet: a new wave may be on its way): wait a little, then hand it back upstream
        since = node.noroute_since.setdefault(d, now)
        if now < since + node.cfg.noroute_grace_s:
            eff.append(SetTimer("balance", since + node.cfg.noroute_grace_s))
            return
        ups = sorted(p for p, n in node.inn[d].items() if n > 0)
        if not ups:
            return
        dec = (Via.BACK, ups[0])
    node.noroute_since.pop(d, None)
    kind, peer = dec
    if kind == Via.FORWARD:
        rid = node.new_id()
        node.pending[rid] = Pending(PendingKind.LAUNCH, peer, d)
        node.token_pending = True
        eff.append(Send(peer, RequestFlow(rid, d, node.lin[d][peer].cost)))
    else:
        take_one(node.inn[d], peer)
        node.changed(now)
        eff.append(Send(peer, Deny(d, DenyReason.NO_ROUTE)))
        waves.log_step(node, d, (Step.BACK, peer))
        announce.refresh_all(node, eff)
        act(node, now, eff)

def shed_one(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Over capacity (an agreed move raced with new work): hand the dearest inflow back."""
    cands = [(node.cfg.prev_costs[p], d, p) for d in node.cfg.commodities for p, n in node.inn[d].items() if n > 0]
    _, d, p = max(sorted(cands))
    take_one(node.inn[d], p)
    node.changed(now)
    eff.append(Send(p, Deny(d, DenyReason.NO_ROUTE)))
    announce.refresh_all(node, eff)
    act(node, now, eff)

def withdraw_one(node: FlowNode, now: float, d: str, eff: list[Effect]) -> None:
    """Too much outflow: take back the unit on the dearest downstream route."""
    def dearness(j: str) -> float:
        lab = node.lin[d].get(j)
        return node.cfg.next_costs[j] + (lab.cost if lab is not None else INF)
    cands = [j for j, n in node.out[d].items() if n > 0]
    if not cands:
        return
    j = max(sorted(cands), key=dearness)
    rid = node.new_id()
    node.pending[rid] = Pending(PendingKind.WITHDRAW, j, d)
    eff.append(Send(j, Withdraw(rid, d)))

def on_request_flow(node: FlowNode, now: float, sender: str, msg: RequestFlow, eff: list[Effect]) -> None:
    d = msg.commodity
    cfg = node.cfg
    if sender not in cfg.prev_costs or d not in node.inn:
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NOT_LINKED, None)))
        return
    if cfg.is_data:
        if d != cfg.node_id:
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY, None)))
            return
        add_one(node.inn[d], sender)  # the sink always takes its own units
        node.changed(now)
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
        if not msg.forced:
            launches.settled(node, now, eff, arrived=True)
        return
    if msg.forced and waves.walk_back(node, now, sender, msg, eff):
        return
    if msg.forced:
        add_one(node.inn[d], sender)
        node.changed(now)
        node.grace_until = max(node.grace_until, now + cfg.balance_grace_s)
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
        announce.refresh_all(node, eff)
        return
    lab = node.my_in.get(d, NO_LABEL)
    if lab.cost == INF:
        node.stats.rejects += 1
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY, stamped(lab, node.epoch[d]))))
        return
    if abs(lab.cost - msg.expected_cost) > EPS:
        node.stats.rejects += 1
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.COST_CHANGED, stamped(lab, node.epoch[d]))))
        return
    dec = node.dec_in[d]
    if dec is not None and dec[0] == Via.BACK and dec[1] == sender:
        # taking the unit would displace the requester's own unit: a no-op it must not retry
        node.stats.rejects += 1
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY,
                                       stamped(Label(d, Side.IN, INF, ()), node.epoch[d]))))
        return
    add_one(node.inn[d], sender)
    node.changed(now)
    eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
    if dec is not None and dec[0] == Via.BACK:
        take_one(node.inn[d], dec[1])
        eff.append(Send(dec[1], Deny(d, DenyReason.DISPLACED)))
        waves.log_step(node, d, (Step.THROUGH, sender, dec[1]))
    elif dec is not None and dec[0] == Via.CROSS:
        p, b = dec[1], dec[2]
        if take_one(node.inn[b], p):
            node.relabelling.crossed += 1
            eff.append(Send(p, Deny(b, DenyReason.DISPLACED)))
            relabel.relabel_down(node, now, b, d, eff)
    else:
        waves.log_step(node, d, (Step.IN, sender))
    announce.refresh_all(node, eff)

def on_flow_reply(node: FlowNode, now: float, sender: str, msg: FlowReply, eff: list[Effect]) -> None:
    pend = node.pending.pop(msg.req_id, None)
    if pend is None:
        node.stats.ignored += 1
        return
    d = pend.commodity
    if pend.kind == PendingKind.LAUNCH:
        node.token_pending = False
    if msg.outcome == Reply.APPROVED:
        node.rejects_in_row = 0
        if pend.kind == PendingKind.WITHDRAW:
            take_one(node.out[d], sender)
        else:
            first = node.out[d].get(sender, 0) == 0
            add_one(node.out[d], sender)
            if node.cfg.is_data and pend.kind == PendingKind.LAUNCH:
                node.launch.pending += 1
            elif pend.kind == PendingKind.LAUNCH:
                waves.log_step(node, d, (Step.FORWARD, sender))
            if first:
                announce.refresh(node, [d], eff, {d: {sender}})
        node.changed(now)
        return
    if pend.kind == PendingKind.WITHDRAW:
        return  # already handed back by the peer: its Deny/Reroute adjusts our count
    if pend.kind == PendingKind.LAUNCH and node.cfg.is_data and node.waves and node.launch.next_at == INF:
        node.launch.next_at = node.launch.relaunch_at
    node.rejects_in_row += 1
    if msg.current is not None:
        labels.ingest(node, sender, msg.current)
    else:
        node.lin[d][sender] = Label(d, Side.IN, INF, ())
    announce.refresh(node, [d], eff)
    if pend.kind == PendingKind.LAUNCH and node.cfg.is_data and node.waves and node.cfg.same_wave_launches \
            and d == node.cfg.node_id and node.launch.wave_launches > 0:
        # a later launch of this wave found its first hop dearer: another tight first hop, else a new wave
        if waves.tight(node, d) and node.rejects_in_row < MAX_REJECTS_BEFORE_WAIT:
            node.launch.next_at = now
        else:
            launches.new_wave(node, now, eff)

def on_deny(node: FlowNode, now: float, sender: str, msg: Deny, eff: list[Effect]) -> None:
    d = msg.commodity
    if d not in node.out or not take_one(node.out[d], sender):
        node.stats.ignored += 1
        return
    node.changed(now)
    if node.cfg.is_data:
        launches.settled(node, now, eff)
    elif waves.walking(node):
        walk = node.wave.walk.setdefault(d, [])
        if msg.reason == DenyReason.NO_ROUTE and walk and walk[-1] == (Step.FORWARD, sender):
            walk.pop()  # the unit we handed `sender` retreated: it is ours to route again
        else:
            walk.append((Step.HANDED_BACK, sender))  # a unit handed back along a residual arc (a step, not a retreat)
    announce.refresh(node, [d], eff)

def on_reroute(node: FlowNode, now: float, sender: str, msg: Reroute, eff: list[Effect]) -> None:
    d = msg.commodity
    if d not in node.out or not take_one(node.out[d], sender):
        node.stats.ignored += 1
        return
    node.changed(now)
    if msg.to in node.cfg.next_costs:
        rid = node.new_id()
        node.pending[rid] = Pending(PendingKind.FORCED, msg.to, d)
        eff.append(Send(msg.to, RequestFlow(rid, d, 0.0, forced=True)))
    node.grace_until = max(node.grace_until, now + node.cfg.balance_grace_s)

def on_withdraw(node: FlowNode, now: float, sender: str, msg: Withdraw, eff: list[Effect]) -> None:
    d = msg.commodity
    if d in node.inn and take_one(node.inn[d], sender):
        node.changed(now)
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
        if not node.cfg.is_data:
            node.grace_until = max(node.grace_until, now + node.cfg.balance_grace_s)
            if sender in node.cfg.commodities:
                relabel.refused(node, sender)  # a data node gives a unit back: it is at its demand
            announce.refresh_all(node, eff)
    else:
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_SUCH_FLOW, None)))
