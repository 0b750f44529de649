"""Improvement moves: Request Change and Request Redirect, accepted by simulated annealing (section V-C).

A node asks a random same-stage peer for its flows (QueryFlows / FlowReport,
`start_query`, `on_query`) and picks the best move against them
(`on_report`): Change swaps the next hops of one unit each, same commodity;
Redirect takes a peer's unit prev -> peer -> next through the asking node when
it has room.  The objective is the sum of link costs (Equation 2), not the
paper's maximum, because the mean cost per microbatch is what we minimise.  A
move that lowers the cost is proposed; a worse one only with annealing on and
when `Annealer` accepts it (exp(-delta / T) > U(0, 1)), flagged
`temperature_accept` so that the receiver takes it too.  The receiver checks the move against its own
state (`on_request_change`, `on_request_redirect`); an agreed move is carried
out with forced Request Flows and Withdraws on both sides (`apply_swap`,
`on_move_reply`), and the requester cools (T <- alpha x T) after each.

When moves run.  All the time with `FlowConfig.improve`, which by default is
on with several data nodes: there the flows that ordered launches,
relabelling and cross displacement form leave local improvements, which the
moves find for a few more messages (one QueryFlows / FlowReport per relay and
round, and the label changes a move causes).  With one data node the flows are
already optimal (successive shortest paths), so the moves would only cost
messages.  After a membership change or joining every node runs them for
`change_improve_rounds` whatever `improve` says, which is how flows move to a
cheaper newcomer.  Worse moves by annealing only with `FlowConfig.anneal`: on
top of the mechanisms above they raise the cost and multiply the messages, so
it is off (the figures: docs/bench_flow.md, "Improvement moves and
annealing").  One move is open per node at a time; a move unanswered for a
round is dropped.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..effects import Effect, Send
from ..messages import (
    INF, FlowReport, HopFlow, MoveReply, QueryFlows, Reply, RequestChange, RequestFlow, RequestRedirect, Reroute, Withdraw,
)
from . import announce, units
from .config import ALPHA_DEFAULT, T0_DEFAULT, T_MIN_DEFAULT
from .state import EPS, PendingKind

if TYPE_CHECKING:
    from .node import FlowNode


@dataclass
class Annealer:
    """Simulated annealing acceptance (after Johnson et al., as the paper).

    A move that raises the cost by `delta` > 0 is accepted when
    exp(-delta / T) > U(0, 1); after each accepted move T <- alpha x T.  Below
    `t_min` the node stops exploring, so that a converged swarm stops moving
    flows around."""

    temperature: float = T0_DEFAULT
    alpha: float = ALPHA_DEFAULT
    t_min: float = T_MIN_DEFAULT

    def accepts_worse(self, delta: float, rng: random.Random) -> bool:
        """Whether to take a move that raises the cost by `delta` (> 0)."""
        if self.temperature < self.t_min or delta <= 0:
            return False
        return math.exp(-delta / self.temperature) > rng.random()

    def cool(self) -> None:
        self.temperature *= self.alpha


class MoveKind(enum.Enum):
    CHANGE = "change"  # swap my next hop `a` with the peer's next hop `b` (one unit each, same commodity)
    REDIRECT = "redirect"  # carry the peer's unit from prev `a` to next `b` myself


@dataclass
class Move:
    move_id: int
    peer: str
    kind: MoveKind
    commodity: str
    a: str  # change: my next hop j1; redirect: prev p
    b: str  # change: peer's next hop j2; redirect: next q
    deadline: float


@dataclass
class MoveState:
    annealer: Annealer
    current: Move | None = None  # the move proposed and not answered yet
    query_target: str | None = None  # the peer asked for its flows (its FlowReport is the one read)
    change_until: float = -INF  # improvement moves after a membership change until then (`after_change`)


def after_change(node: FlowNode, now: float) -> None:
    """A membership change (or this node joined): run moves for `change_improve_rounds`, annealing them from t0
    again with `anneal_after_change`."""
    cfg = node.cfg
    node.moves.change_until = max(node.moves.change_until, now + cfg.change_improve_rounds * cfg.round_s)
    if cfg.anneal_after_change:
        node.moves.annealer.temperature = cfg.t0


def start_query(node: FlowNode, now: float, eff: list[Effect]) -> None:
    if not node.cfg.peers:
        return
    node.moves.query_target = node.rng.choice(node.cfg.peers)
    eff.append(Send(node.moves.query_target, QueryFlows(node.new_id())))

def on_query(node: FlowNode, now: float, sender: str, msg: QueryFlows, eff: list[Effect]) -> None:
    ins, outs = [], []
    for d in node.cfg.commodities:
        for p, n in sorted(node.units.inn[d].items()):
            if n > 0:
                ins.append(HopFlow(d, p, n, node.cfg.prev_costs[p]))
        for j, n in sorted(node.units.out[d].items()):
            if n > 0:
                outs.append(HopFlow(d, j, n, node.cfg.next_costs[j]))
    eff.append(Send(sender, FlowReport(msg.query_id, node.cfg.capacity, node.used(), tuple(ins),
                                       tuple(outs), tuple(sorted(node.cfg.next_costs.items())))))

def on_report(node: FlowNode, now: float, sender: str, rep: FlowReport, eff: list[Effect]) -> None:
    if sender != node.moves.query_target or node.moves.current is not None or not units.quiet(node):
        return
    node.moves.query_target = None
    cfg = node.cfg
    peer_next = dict(rep.next_costs)
    best = None  # (delta, kind, d, a, b)
    for h in rep.outflows:  # Request Change: swap my j1 with the peer's j2
        d, j2 = h.commodity, h.peer
        if j2 not in cfg.next_costs or d not in node.out:  # (a data node this node does not know, or forgot)
            continue
        for j1, n in sorted(node.units.out[d].items()):
            if n <= 0 or j1 == j2 or j1 not in peer_next:
                continue
            delta = cfg.next_costs[j2] + peer_next[j1] - cfg.next_costs[j1] - h.cost
            if best is None or delta < best[0] - EPS:
                best = (delta, MoveKind.CHANGE, d, j1, j2)
    if node.used() < cfg.capacity:  # Request Redirect: carry prev -> peer -> next myself
        for hi in rep.inflows:
            if hi.peer not in cfg.prev_costs:
                continue
            for ho in rep.outflows:
                if ho.commodity != hi.commodity or ho.peer not in cfg.next_costs or ho.commodity not in node.out:
                    continue
                delta = cfg.prev_costs[hi.peer] + cfg.next_costs[ho.peer] - hi.cost - ho.cost
                if best is None or delta < best[0] - EPS:
                    best = (delta, MoveKind.REDIRECT, hi.commodity, hi.peer, ho.peer)
    if best is None or abs(best[0]) <= EPS:
        return
    delta, kind, d, a, b = best
    annealed = False
    if delta > 0:
        annealing = node.cfg.anneal or (node.cfg.anneal_after_change and now < node.moves.change_until)
        if not annealing or not node.moves.annealer.accepts_worse(delta, node.rng):
            return
        annealed = True
        node.stats.anneal_accept()
    mid = node.new_id()
    node.moves.current = Move(mid, sender, kind, d, a, b, now + cfg.round_s)
    if kind == MoveKind.CHANGE:
        eff.append(Send(sender, RequestChange(mid, d, a, b, cfg.next_costs[b] - cfg.next_costs[a], annealed)))
    else:
        via = cfg.prev_costs[a] + cfg.next_costs[b]
        eff.append(Send(sender, RequestRedirect(mid, d, a, b, via, annealed)))

def busy(node: FlowNode) -> bool:
    return node.moves.current is not None or not units.quiet(node)

def on_request_change(node: FlowNode, now: float, sender: str, msg: RequestChange, eff: list[Effect]) -> None:
    d, j1, j2 = msg.commodity, msg.requester_next, msg.receiver_next
    cfg = node.cfg
    if busy(node):
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.BUSY)))
        return
    if d not in node.units.out or node.units.out[d].get(j2, 0) <= 0:
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.NO_SUCH_FLOW)))
        return
    if j1 not in cfg.next_costs:
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.NOT_LINKED)))
        return
    total = msg.requester_delta + cfg.next_costs[j1] - cfg.next_costs[j2]
    if total >= -EPS and not msg.temperature_accept:
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.NOT_IMPROVING)))
        return
    apply_swap(node, now, d, drop=j2, add=j1, eff=eff)
    eff.append(Send(sender, MoveReply(msg.move_id, Reply.APPROVED)))

def on_request_redirect(node: FlowNode, now: float, sender: str, msg: RequestRedirect, eff: list[Effect]) -> None:
    d, p, q = msg.commodity, msg.prev, msg.next
    if busy(node):
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.BUSY)))
        return
    if d not in node.units.inn or node.units.inn[d].get(p, 0) <= 0 or node.units.out[d].get(q, 0) <= 0:
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.NO_SUCH_FLOW)))
        return
    mine = node.cfg.prev_costs[p] + node.cfg.next_costs[q]
    if msg.via_requester_cost - mine >= -EPS and not msg.temperature_accept:
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.NOT_IMPROVING)))
        return
    node.units.take_in(d, p)
    node.changed(now)
    eff.append(Send(p, Reroute(d, sender)))
    rid = node.units.request(PendingKind.WITHDRAW, q, d)
    eff.append(Send(q, Withdraw(rid, d)))
    node.units.grace(now + node.cfg.balance_grace_s)
    node.stats.move_done()
    eff.append(Send(sender, MoveReply(msg.move_id, Reply.APPROVED)))
    announce.refresh_all(node, eff)

def apply_swap(node: FlowNode, now: float, d: str, drop: str, add: str, eff: list[Effect]) -> None:
    rid = node.units.request(PendingKind.WITHDRAW, drop, d)
    eff.append(Send(drop, Withdraw(rid, d)))
    rid = node.units.request(PendingKind.FORCED, add, d)
    eff.append(Send(add, RequestFlow(rid, d, 0.0, forced=True)))
    node.units.grace(now + node.cfg.balance_grace_s)
    node.stats.move_done()

def on_move_reply(node: FlowNode, now: float, sender: str, msg: MoveReply, eff: list[Effect]) -> None:
    mv = node.moves.current
    if mv is None or mv.move_id != msg.move_id:
        node.stats.ignore()
        return
    node.moves.current = None
    if msg.outcome != Reply.APPROVED:
        return
    node.moves.annealer.cool()
    d = mv.commodity
    if mv.kind == MoveKind.CHANGE:
        apply_swap(node, now, d, drop=mv.a, add=mv.b, eff=eff)
    else:
        # the peer reroutes prev's unit to us; we send it on to `next`
        rid = node.units.request(PendingKind.FORCED, mv.b, d)
        eff.append(Send(mv.b, RequestFlow(rid, d, 0.0, forced=True)))
        node.units.grace(now + node.cfg.balance_grace_s)


def expire(node: FlowNode, now: float) -> None:
    """Tick: a move whose peer never answered within its round is given up."""
    if node.moves.current is not None and now >= node.moves.current.deadline:
        node.moves.current = None


def neighbour_removed(node: FlowNode, peer: str) -> None:
    """`peer` left: the query and the move open with it are dropped."""
    if node.moves.query_target == peer:
        node.moves.query_target = None
    move = node.moves.current
    if move is not None and peer in (move.peer, move.a, move.b):
        node.moves.current = None
