"""Flow formation: the decentralized min-cost flow of GWTF (section V-C).

Theory of operation
-------------------
A *unit* of flow is one microbatch slot on a route data node -> one relay per
stage -> the same data node.  Units are fungible within a *commodity* (the
data node they return to).  Every node only knows its own links (to the
previous and the next stage, given by discovery), its same-stage peers, and
what they tell it.

Each node keeps, per commodity, how many units it receives from each upstream
peer (`inn`) and sends to each downstream peer (`out`); a relay holds at most
`capacity` units.  The downstream end of a link owns the count of that link:
every change is decided by the receiver (approve, Deny, Reroute, approve a
Withdraw) and copied by the sender when the receiver's message arrives, so the
two ends always agree once messages are delivered (links are FIFO).

Cost-to-sink (the paper's announcement travelling back to front) is a pair of
labels per commodity, computed by each node from its neighbours' labels over
the *residual* network, as in successive-shortest-path min-cost flow:

* IN  = cost of handing this node one more unit.  Either it has room and
  forwards the unit (`F`: d(i, j) + IN_j, the cheapest next hop), or it is
  full and *displaces* one unit it receives from an upstream peer p, which p
  then routes elsewhere (`B`: -d(p, i) + OUT_p).
* OUT = cost for this node to get rid of a unit it holds: forward it (`F`) or
  hand one back upstream (`B`, the paper's DENY).

Labels carry the residual path behind them (side-tagged ids `id+`/`id-`); a
node ignores a neighbour's label whose path already contains it, so the
distance-vector announcements cannot loop or count to infinity.

Request Flow: a node that holds an unpaired unit (more inflow than outflow;
for a data node, demand not yet placed) sends Request Flow to the neighbour
behind its OUT label with the cost it expects.  The receiver approves when its
IN label still has that cost, else rejects and tells its current cost.  On
approval the unit moves: the receiver forwards it in turn, or displaces an
upstream unit (that peer now holds an unpaired unit), or, if it cannot go on,
sends DENY upstream.  A data node launches one unit at a time and waits for it
to settle (arrive at the sink or come back), so that each unit follows a
shortest augmenting path on converged labels: with one data node this is
exactly successive shortest paths, which reaches the maximum flow at minimum
cost.  We chose this over the paper's greedy back-to-front pairing because the
latter leaves a gap to the optimum that Request Change and Request Redirect
alone do not close (the residual "displace" step is what closes it).

Request Change and Request Redirect (improvement moves, one per tick at most):
a node asks a random same-stage peer for its flows (QueryFlows/FlowReport).
Change swaps the next hops of one unit each, same commodity; Redirect takes a
peer's unit prev -> peer -> next through the asking node when it has room.
The objective is the sum of link costs (Equation 2), not the paper's maximum,
because the mean cost per microbatch is what we minimise.  A move that lowers
the cost is taken; a worse one is taken by simulated annealing (`anneal.py`).
An agreed move is carried out with forced Request Flows and Withdraws; nodes
wait `balance_grace_s` before acting on an imbalance a move created, so that
the matching half of the move can arrive.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping

from .anneal import ALPHA_DEFAULT, T0_DEFAULT, T_MIN_DEFAULT, Annealer
from .effects import Effect, Send, SetTimer
from .messages import (
    INF, CostAnnounce, Deny, DenyReason, FlowReply, FlowReport, HopFlow, Label, MoveReply,
    QueryFlows, Reply, RequestChange, RequestFlow, RequestRedirect, Reroute, Side, Withdraw,
)

EPS = 1e-9  # costs closer than this are equal
MAX_REJECTS_BEFORE_WAIT = 4  # consecutive rejections before a unit waits for the next tick


@dataclass(frozen=True)
class FlowConfig:
    node_id: str
    is_data: bool
    capacity: int
    commodities: tuple[str, ...]  # the data nodes of the run
    next_costs: Mapping[str, float]  # linked peers of the next stage (data node: stage 0)
    prev_costs: Mapping[str, float]  # linked peers of the previous stage (data node: last stage)
    peers: tuple[str, ...] = ()  # same-stage relays known from discovery
    displace: bool = True  # IN labels may displace an upstream unit (residual backward edge)
    round_s: float = 1.0  # one round: each node ticks once
    path_announce_s: float = 0.1  # a changed route at an unchanged cost is announced at most this often
    launch_settle_s: float = 0.2  # a data node waits this long after a unit settled
    balance_grace_s: float = 0.3  # wait for the other half of an agreed move
    improve: bool = False  # run Request Change / Request Redirect with annealing (off by default: see module doc)
    t0: float = T0_DEFAULT
    alpha: float = ALPHA_DEFAULT
    t_min: float = T_MIN_DEFAULT


_NO_LABEL = Label("", Side.IN, INF, ())


def _cost_differs(new: Label, old: Label | None) -> bool:
    return old is None or abs(new.cost - old.cost) > EPS or (new.cost == INF) != (old.cost == INF)


def _dsum(d: dict[str, int]) -> int:
    return sum(d.values())


def _dec(d: dict[str, int], key: str) -> bool:
    n = d.get(key, 0)
    if n <= 0:
        return False
    if n == 1:
        del d[key]
    else:
        d[key] = n - 1
    return True


def _inc(d: dict[str, int], key: str) -> None:
    d[key] = d.get(key, 0) + 1


@dataclass
class _Pending:
    kind: str  # "token", "forced", "withdraw"
    peer: str
    commodity: str


@dataclass
class _Move:
    move_id: int
    peer: str
    kind: str  # "change" or "redirect"
    commodity: str
    a: str  # change: my next hop j1; redirect: prev p
    b: str  # change: peer's next hop j2; redirect: next q
    deadline: float


@dataclass
class FlowStats:
    flow_changes: int = 0
    last_change: float = 0.0
    rejects: int = 0
    moves_done: int = 0
    anneal_accepts: int = 0
    ignored: int = 0  # messages that no longer applied (stale)


class FlowNode:
    """One node's flow machine: handed `now`, an event and its seeded RNG, returns effects."""

    def __init__(self, config: FlowConfig, rng: random.Random) -> None:
        self.cfg = config
        self.rng = rng
        me = config.node_id
        self.tag_in, self.tag_out = me + "+", me + "-"
        self.inn: dict[str, dict[str, int]] = {d: {} for d in config.commodities}
        self.out: dict[str, dict[str, int]] = {d: {} for d in config.commodities}
        self.lin: dict[str, dict[str, Label]] = {d: {} for d in config.commodities}
        self.lout: dict[str, dict[str, Label]] = {d: {} for d in config.commodities}
        self.my_in: dict[str, Label] = {}
        self.my_out: dict[str, Label] = {}
        self.dec_in: dict[str, tuple[str, str] | None] = {}
        self.dec_out: dict[str, tuple[str, str] | None] = {}
        self.pending: dict[int, _Pending] = {}
        self.token_pending = False
        self.rejects_in_row = 0
        self.next_id = 1
        self.move: _Move | None = None
        self.grace_until = 0.0
        self.query_target: str | None = None
        self.annealer = Annealer(config.t0, config.alpha, config.t_min)
        self.stats = FlowStats()
        self._stale: set[tuple[str, Side]] = set()
        self._flush_armed = False
        self._now = 0.0
        # data node only
        self.launch_pending = 0
        self.next_launch = 0.0
        self.demand = config.capacity if config.is_data else 0

    # ------------------------------------------------------------ helpers
    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def used(self) -> int:
        return sum(_dsum(v) for v in self.inn.values())

    def _changed(self, now: float) -> None:
        self.stats.flow_changes += 1
        self.stats.last_change = now

    def _out_eff(self, d: str) -> int:
        n = _dsum(self.out[d])
        for p in self.pending.values():
            if p.commodity == d:
                n += 1 if p.kind != "withdraw" else -1
        return n

    def imbalance(self, d: str) -> int:
        """Units held but not passed on (> 0) or passed on but not held (< 0)."""
        if self.cfg.is_data:
            return 0
        return _dsum(self.inn[d]) - self._out_eff(d)

    # ------------------------------------------------------------ labels
    def _compute(self, d: str) -> None:
        cfg = self.cfg
        tin, tout = self.tag_in, self.tag_out
        if cfg.is_data:
            if d != cfg.node_id:
                return
            best, arg = INF, None
            for j, c in cfg.next_costs.items():
                lab = self.lin[d].get(j)
                if lab is None or lab.cost == INF or tout in lab.path:
                    continue
                v = c + lab.cost
                if v < best - EPS or (v <= best + EPS and arg is not None and j < arg[0]):
                    best, arg = v, (j, lab)
            if arg is None:
                self.my_out[d], self.dec_out[d] = Label(d, Side.OUT, INF, ()), None
            else:
                self.my_out[d] = Label(d, Side.OUT, best, (tout,) + arg[1].path)
                self.dec_out[d] = ("F", arg[0])
            self.my_in[d] = Label(d, Side.IN, 0.0, (tin,))
            return
        lin, lout = self.lin[d], self.lout[d]
        # The residual path behind a label must not revisit the side it starts from:
        # F for OUT starts at i-, F for IN at i+ then i-; B for IN at i+, B for OUT at i- then i+.
        f_out = f_in = (INF, None)
        for j, c in cfg.next_costs.items():
            lab = lin.get(j)
            if lab is None or lab.cost == INF or tout in lab.path:
                continue
            v = c + lab.cost
            cand = (v, j, lab)
            if f_out[1] is None or v < f_out[0] - EPS or (v <= f_out[0] + EPS and j < f_out[1]):
                f_out = cand
            if tin not in lab.path and (f_in[1] is None or v < f_in[0] - EPS or (v <= f_in[0] + EPS and j < f_in[1])):
                f_in = cand
        b_in = b_out = (INF, None)
        for p, n in self.inn[d].items():
            lab = lout.get(p)
            if n <= 0 or lab is None or lab.cost == INF or tin in lab.path:
                continue
            v = lab.cost - cfg.prev_costs[p]
            cand = (v, p, lab)
            if b_in[1] is None or v < b_in[0] - EPS or (v <= b_in[0] + EPS and p < b_in[1]):
                b_in = cand
            if tout not in lab.path and (b_out[1] is None or v < b_out[0] - EPS or (v <= b_out[0] + EPS and p < b_out[1])):
                b_out = cand
        held = _dsum(self.inn[d]) > 0
        room = self.used() < cfg.capacity
        if not held:
            b_out = (INF, None)
        if not cfg.displace:
            b_in = (INF, None)
        if not room:
            f_in = (INF, None)
        # OUT: forward the unit, or hand one back upstream (DENY)
        if f_out[1] is not None and (b_out[1] is None or f_out[0] <= b_out[0] + EPS):
            self.my_out[d] = Label(d, Side.OUT, f_out[0], (tout,) + f_out[2].path)
            self.dec_out[d] = ("F", f_out[1])
        elif b_out[1] is not None:
            self.my_out[d] = Label(d, Side.OUT, b_out[0], (tout, tin) + b_out[2].path)
            self.dec_out[d] = ("B", b_out[1])
        else:
            self.my_out[d], self.dec_out[d] = Label(d, Side.OUT, INF, ()), None
        # IN: take the unit and forward it, or displace an upstream unit
        if f_in[1] is not None and (b_in[1] is None or f_in[0] <= b_in[0] + EPS):
            self.my_in[d] = Label(d, Side.IN, f_in[0], (tin, tout) + f_in[2].path)
            self.dec_in[d] = ("F", f_in[1])
        elif b_in[1] is not None:
            self.my_in[d] = Label(d, Side.IN, b_in[0], (tin,) + b_in[2].path)
            self.dec_in[d] = ("B", b_in[1])
        else:
            self.my_in[d], self.dec_in[d] = Label(d, Side.IN, INF, ()), None

    def _refresh(self, commodities, eff: list[Effect], force_to: dict[str, set[str]] | None = None) -> None:
        """Recompute labels and announce the ones that changed to whoever uses them.

        A changed cost is announced at once.  A route that changed at the same
        cost is announced by the next `path_announce_s` flush: neighbours need
        it to keep their loop checks right, but sending every such change at
        once floods the swarm while many units move.
        """
        outbox: dict[str, list[Label]] = {}
        cfg = self.cfg
        for d in commodities:
            old_in, old_out = self.my_in.get(d), self.my_out.get(d)
            self._compute(d)
            new_in, new_out = self.my_in.get(d), self.my_out.get(d)
            if new_in is not None and (not cfg.is_data or d == cfg.node_id):
                if _cost_differs(new_in, old_in):
                    self._stale.discard((d, Side.IN))
                    for p in cfg.prev_costs:
                        outbox.setdefault(p, []).append(new_in)
                elif new_in.path != old_in.path:
                    self._stale.add((d, Side.IN))
            if new_out is not None:
                targets: set[str] = set()
                if _cost_differs(new_out, old_out):
                    self._stale.discard((d, Side.OUT))
                    targets = set(self.out[d])
                elif new_out.path != old_out.path:
                    self._stale.add((d, Side.OUT))
                if force_to and d in force_to:
                    targets |= force_to[d]
                for j in targets:
                    outbox.setdefault(j, []).append(new_out)
        if self._stale and not self._flush_armed:
            self._flush_armed = True
            eff.append(SetTimer("announce", self._now + cfg.path_announce_s))
        for peer in sorted(outbox):
            eff.append(Send(peer, CostAnnounce(tuple(outbox[peer]))))

    def _flush(self, eff: list[Effect]) -> None:
        self._flush_armed = False
        outbox: dict[str, list[Label]] = {}
        for d, side in sorted(self._stale):
            if side == Side.IN:
                for p in self.cfg.prev_costs:
                    outbox.setdefault(p, []).append(self.my_in[d])
            else:
                for j in self.out[d]:
                    outbox.setdefault(j, []).append(self.my_out[d])
        self._stale.clear()
        for peer in sorted(outbox):
            eff.append(Send(peer, CostAnnounce(tuple(outbox[peer]))))

    def _refresh_all(self, eff: list[Effect], force_to=None) -> None:
        self._refresh(self.cfg.commodities, eff, force_to)

    # ------------------------------------------------------------ entry points
    def start(self, now: float) -> list[Effect]:
        eff: list[Effect] = []
        self._now = now
        self._refresh_all(eff)  # a data node announces its (constant) sink label here
        phase = self.rng.uniform(0.0, self.cfg.round_s)
        eff.append(SetTimer("tick", now + phase))
        return eff

    def on_timer(self, now: float, key: str) -> list[Effect]:
        eff: list[Effect] = []
        self._now = now
        if key == "announce":
            self._flush(eff)
        if key == "tick":
            eff.append(SetTimer("tick", now + self.cfg.round_s))
            self.rejects_in_row = 0
            if self.move is not None and now >= self.move.deadline:
                self.move = None  # the peer never answered: give up the move
            if self.cfg.improve and not self.cfg.is_data and self.move is None and self._quiet():
                self._start_query(now, eff)
        self._act(now, eff)
        return eff

    def on_message(self, now: float, sender: str, msg) -> list[Effect]:
        eff: list[Effect] = []
        self._now = now
        handler = _HANDLERS.get(type(msg))
        if handler is None:
            self.stats.ignored += 1
            return eff
        handler(self, now, sender, msg, eff)
        self._act(now, eff)
        return eff

    # ------------------------------------------------------------ acting on state
    def _quiet(self) -> bool:
        return not self.pending and all(self.imbalance(d) == 0 for d in self.cfg.commodities)

    def _act(self, now: float, eff: list[Effect]) -> None:
        if self.cfg.is_data:
            self._maybe_launch(now, eff)
            return
        if now < self.grace_until:
            if any(self.imbalance(d) for d in self.cfg.commodities):
                eff.append(SetTimer("balance", self.grace_until))
            return
        if self.token_pending or self.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT:
            return
        if self.used() > self.cfg.capacity:
            self._shed_one(now, eff)
            return
        for d in self.cfg.commodities:
            imb = self.imbalance(d)
            if imb > 0:
                self._dispatch(now, d, eff)
                return
            if imb < 0:
                self._withdraw_one(now, d, eff)
                return

    def _dispatch(self, now: float, d: str, eff: list[Effect]) -> None:
        """Move one unpaired unit along the OUT label: forward it, or DENY it back."""
        dec = self.dec_out.get(d)
        if dec is None:
            # no route known at all: hand it back to any upstream peer
            ups = sorted(p for p, n in self.inn[d].items() if n > 0)
            if not ups:
                return
            dec = ("B", ups[0])
        kind, peer = dec
        if kind == "F":
            rid = self._id()
            self.pending[rid] = _Pending("token", peer, d)
            self.token_pending = True
            eff.append(Send(peer, RequestFlow(rid, d, self.lin[d][peer].cost)))
        else:
            _dec(self.inn[d], peer)
            self._changed(now)
            eff.append(Send(peer, Deny(d, DenyReason.NO_ROUTE)))
            self._refresh_all(eff)
            self._act(now, eff)

    def _shed_one(self, now: float, eff: list[Effect]) -> None:
        """Over capacity (an agreed move raced with new work): hand the dearest inflow back."""
        cands = [(self.cfg.prev_costs[p], d, p) for d in self.cfg.commodities for p, n in self.inn[d].items() if n > 0]
        _, d, p = max(sorted(cands))
        _dec(self.inn[d], p)
        self._changed(now)
        eff.append(Send(p, Deny(d, DenyReason.NO_ROUTE)))
        self._refresh_all(eff)
        self._act(now, eff)

    def _withdraw_one(self, now: float, d: str, eff: list[Effect]) -> None:
        """Too much outflow: take back the unit on the dearest downstream route."""
        def dearness(j: str) -> float:
            lab = self.lin[d].get(j)
            return self.cfg.next_costs[j] + (lab.cost if lab is not None else INF)
        cands = [j for j, n in self.out[d].items() if n > 0]
        if not cands:
            return
        j = max(sorted(cands), key=dearness)
        rid = self._id()
        self.pending[rid] = _Pending("withdraw", j, d)
        eff.append(Send(j, Withdraw(rid, d)))

    def _maybe_launch(self, now: float, eff: list[Effect]) -> None:
        d = self.cfg.node_id
        if self.token_pending or self.launch_pending > 0 or now < self.next_launch:
            if self.launch_pending <= 0 and not self.token_pending and now < self.next_launch:
                eff.append(SetTimer("launch", self.next_launch))
            return
        if _dsum(self.out[d]) >= self.demand or self.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT:
            return
        dec = self.dec_out.get(d)
        if dec is None:
            return
        j = dec[1]
        rid = self._id()
        self.pending[rid] = _Pending("token", j, d)
        self.token_pending = True
        eff.append(Send(j, RequestFlow(rid, d, self.lin[d][j].cost)))

    def _settled(self, now: float, eff: list[Effect]) -> None:
        """A data node's launched unit arrived or came back.

        The unit can reach the sink before the first hop's approval is back at
        the data node, so the count may dip below zero for a moment; launching
        waits while it is positive.
        """
        self.launch_pending -= 1
        self.next_launch = now + self.cfg.launch_settle_s
        eff.append(SetTimer("launch", self.next_launch))

    # ------------------------------------------------------------ handlers
    def _on_announce(self, now: float, sender: str, msg: CostAnnounce, eff: list[Effect]) -> None:
        touched = []
        for lab in msg.labels:
            if lab.commodity not in self.lin:
                continue
            if lab.side == Side.IN and sender in self.cfg.next_costs:
                self.lin[lab.commodity][sender] = lab
            elif lab.side == Side.OUT and sender in self.cfg.prev_costs:
                self.lout[lab.commodity][sender] = lab
            else:
                continue
            touched.append(lab.commodity)
        self._refresh(dict.fromkeys(touched), eff)

    def _on_request_flow(self, now: float, sender: str, msg: RequestFlow, eff: list[Effect]) -> None:
        d = msg.commodity
        cfg = self.cfg
        if sender not in cfg.prev_costs or d not in self.inn:
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NOT_LINKED, None)))
            return
        if cfg.is_data:
            if d != cfg.node_id:
                eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY, None)))
                return
            _inc(self.inn[d], sender)  # the sink always takes its own units
            self._changed(now)
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
            if not msg.forced:
                self._settled(now, eff)
            return
        if msg.forced:
            _inc(self.inn[d], sender)
            self._changed(now)
            self.grace_until = max(self.grace_until, now + cfg.balance_grace_s)
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
            self._refresh_all(eff)
            return
        lab = self.my_in.get(d, _NO_LABEL)
        if lab.cost == INF:
            self.stats.rejects += 1
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY, lab)))
            return
        if abs(lab.cost - msg.expected_cost) > EPS:
            self.stats.rejects += 1
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.COST_CHANGED, lab)))
            return
        dec = self.dec_in[d]
        if dec is not None and dec[0] == "B" and dec[1] == sender:
            # taking the unit would displace the requester's own unit: a no-op it must not retry
            self.stats.rejects += 1
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY, Label(d, Side.IN, INF, ()))))
            return
        _inc(self.inn[d], sender)
        self._changed(now)
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
        if dec is not None and dec[0] == "B":
            _dec(self.inn[d], dec[1])
            eff.append(Send(dec[1], Deny(d, DenyReason.DISPLACED)))
        self._refresh_all(eff)

    def _on_flow_reply(self, now: float, sender: str, msg: FlowReply, eff: list[Effect]) -> None:
        pend = self.pending.pop(msg.req_id, None)
        if pend is None:
            self.stats.ignored += 1
            return
        d = pend.commodity
        if pend.kind == "token":
            self.token_pending = False
        if msg.outcome == Reply.APPROVED:
            self.rejects_in_row = 0
            if pend.kind == "withdraw":
                _dec(self.out[d], sender)
            else:
                first = self.out[d].get(sender, 0) == 0
                _inc(self.out[d], sender)
                if self.cfg.is_data and pend.kind == "token":
                    self.launch_pending += 1
                if first:
                    self._refresh([d], eff, {d: {sender}})
            self._changed(now)
            return
        if pend.kind == "withdraw":
            return  # already handed back by the peer: its Deny/Reroute adjusts our count
        self.rejects_in_row += 1
        self.lin[d][sender] = msg.current if msg.current is not None else Label(d, Side.IN, INF, ())
        self._refresh([d], eff)

    def _on_deny(self, now: float, sender: str, msg: Deny, eff: list[Effect]) -> None:
        d = msg.commodity
        if d not in self.out or not _dec(self.out[d], sender):
            self.stats.ignored += 1
            return
        self._changed(now)
        if self.cfg.is_data:
            self._settled(now, eff)
        self._refresh([d], eff)

    def _on_reroute(self, now: float, sender: str, msg: Reroute, eff: list[Effect]) -> None:
        d = msg.commodity
        if d not in self.out or not _dec(self.out[d], sender):
            self.stats.ignored += 1
            return
        self._changed(now)
        if msg.to in self.cfg.next_costs:
            rid = self._id()
            self.pending[rid] = _Pending("forced", msg.to, d)
            eff.append(Send(msg.to, RequestFlow(rid, d, 0.0, forced=True)))
        self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)

    def _on_withdraw(self, now: float, sender: str, msg: Withdraw, eff: list[Effect]) -> None:
        d = msg.commodity
        if d in self.inn and _dec(self.inn[d], sender):
            self._changed(now)
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
            if not self.cfg.is_data:
                self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)
                self._refresh_all(eff)
        else:
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_SUCH_FLOW, None)))

    # ------------------------------------------------------------ improvement moves
    def _start_query(self, now: float, eff: list[Effect]) -> None:
        if not self.cfg.peers:
            return
        self.query_target = self.rng.choice(self.cfg.peers)
        eff.append(Send(self.query_target, QueryFlows(self._id())))

    def _on_query(self, now: float, sender: str, msg: QueryFlows, eff: list[Effect]) -> None:
        ins, outs = [], []
        for d in self.cfg.commodities:
            for p, n in sorted(self.inn[d].items()):
                if n > 0:
                    ins.append(HopFlow(d, p, n, self.cfg.prev_costs[p]))
            for j, n in sorted(self.out[d].items()):
                if n > 0:
                    outs.append(HopFlow(d, j, n, self.cfg.next_costs[j]))
        eff.append(Send(sender, FlowReport(msg.query_id, self.cfg.capacity, self.used(), tuple(ins),
                                           tuple(outs), tuple(sorted(self.cfg.next_costs.items())))))

    def _on_report(self, now: float, sender: str, rep: FlowReport, eff: list[Effect]) -> None:
        if sender != self.query_target or self.move is not None or not self._quiet():
            return
        self.query_target = None
        cfg = self.cfg
        peer_next = dict(rep.next_costs)
        best = None  # (delta, kind, d, a, b)
        for h in rep.outflows:  # Request Change: swap my j1 with the peer's j2
            d, j2 = h.commodity, h.peer
            if j2 not in cfg.next_costs:
                continue
            for j1, n in sorted(self.out[d].items()):
                if n <= 0 or j1 == j2 or j1 not in peer_next:
                    continue
                delta = cfg.next_costs[j2] + peer_next[j1] - cfg.next_costs[j1] - h.cost
                if best is None or delta < best[0] - EPS:
                    best = (delta, "change", d, j1, j2)
        if self.used() < cfg.capacity:  # Request Redirect: carry prev -> peer -> next myself
            for hi in rep.inflows:
                if hi.peer not in cfg.prev_costs:
                    continue
                for ho in rep.outflows:
                    if ho.commodity != hi.commodity or ho.peer not in cfg.next_costs:
                        continue
                    delta = cfg.prev_costs[hi.peer] + cfg.next_costs[ho.peer] - hi.cost - ho.cost
                    if best is None or delta < best[0] - EPS:
                        best = (delta, "redirect", hi.commodity, hi.peer, ho.peer)
        if best is None or abs(best[0]) <= EPS:
            return
        delta, kind, d, a, b = best
        annealed = False
        if delta > 0:
            if not self.annealer.accepts_worse(delta, self.rng):
                return
            annealed = True
            self.stats.anneal_accepts += 1
        mid = self._id()
        self.move = _Move(mid, sender, kind, d, a, b, now + cfg.round_s)
        if kind == "change":
            eff.append(Send(sender, RequestChange(mid, d, a, b, cfg.next_costs[b] - cfg.next_costs[a], annealed)))
        else:
            via = cfg.prev_costs[a] + cfg.next_costs[b]
            eff.append(Send(sender, RequestRedirect(mid, d, a, b, via, annealed)))

    def _busy(self) -> bool:
        return self.move is not None or not self._quiet()

    def _on_request_change(self, now: float, sender: str, msg: RequestChange, eff: list[Effect]) -> None:
        d, j1, j2 = msg.commodity, msg.requester_next, msg.receiver_next
        cfg = self.cfg
        if self._busy():
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.BUSY)))
            return
        if d not in self.out or self.out[d].get(j2, 0) <= 0:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NO_SUCH_FLOW)))
            return
        if j1 not in cfg.next_costs:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NOT_LINKED)))
            return
        total = msg.requester_delta + cfg.next_costs[j1] - cfg.next_costs[j2]
        if total >= -EPS and not msg.temperature_accept:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NOT_IMPROVING)))
            return
        self._apply_swap(now, d, drop=j2, add=j1, eff=eff)
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.APPROVED)))

    def _on_request_redirect(self, now: float, sender: str, msg: RequestRedirect, eff: list[Effect]) -> None:
        d, p, q = msg.commodity, msg.prev, msg.next
        if self._busy():
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.BUSY)))
            return
        if d not in self.inn or self.inn[d].get(p, 0) <= 0 or self.out[d].get(q, 0) <= 0:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NO_SUCH_FLOW)))
            return
        mine = self.cfg.prev_costs[p] + self.cfg.next_costs[q]
        if msg.via_requester_cost - mine >= -EPS and not msg.temperature_accept:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NOT_IMPROVING)))
            return
        _dec(self.inn[d], p)
        self._changed(now)
        eff.append(Send(p, Reroute(d, sender)))
        rid = self._id()
        self.pending[rid] = _Pending("withdraw", q, d)
        eff.append(Send(q, Withdraw(rid, d)))
        self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)
        self.stats.moves_done += 1
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.APPROVED)))
        self._refresh_all(eff)

    def _apply_swap(self, now: float, d: str, drop: str, add: str, eff: list[Effect]) -> None:
        rid = self._id()
        self.pending[rid] = _Pending("withdraw", drop, d)
        eff.append(Send(drop, Withdraw(rid, d)))
        rid = self._id()
        self.pending[rid] = _Pending("forced", add, d)
        eff.append(Send(add, RequestFlow(rid, d, 0.0, forced=True)))
        self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)
        self.stats.moves_done += 1

    def _on_move_reply(self, now: float, sender: str, msg: MoveReply, eff: list[Effect]) -> None:
        mv = self.move
        if mv is None or mv.move_id != msg.move_id:
            self.stats.ignored += 1
            return
        self.move = None
        if msg.outcome != Reply.APPROVED:
            return
        self.annealer.cool()
        d = mv.commodity
        if mv.kind == "change":
            self._apply_swap(now, d, drop=mv.a, add=mv.b, eff=eff)
        else:
            # the peer reroutes prev's unit to us; we send it on to `next`
            rid = self._id()
            self.pending[rid] = _Pending("forced", mv.b, d)
            eff.append(Send(mv.b, RequestFlow(rid, d, 0.0, forced=True)))
            self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)


_HANDLERS = {
    CostAnnounce: FlowNode._on_announce,
    RequestFlow: FlowNode._on_request_flow,
    FlowReply: FlowNode._on_flow_reply,
    Deny: FlowNode._on_deny,
    Reroute: FlowNode._on_reroute,
    Withdraw: FlowNode._on_withdraw,
    QueryFlows: FlowNode._on_query,
    FlowReport: FlowNode._on_report,
    RequestChange: FlowNode._on_request_change,
    RequestRedirect: FlowNode._on_request_redirect,
    MoveReply: FlowNode._on_move_reply,
}
