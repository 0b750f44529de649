"""Scaled formation: the flows of one data node formed by cost scaling, then handed to the flow machines.

Label waves recompute every label once per augmentation cost, so a node's
messages grow with the units of the swarm (docs/bench_flow.md).  Goldberg and
Tarjan's cost scaling has no such waves: it runs log(largest cost x sides)
phases of `refine` (push/relabel on the min-cost circulation), and inside a
phase only nodes with excess work.  `ScalingMachine` is one node's part of
it, asynchronous, with lazy prices:

* the network (`own_arcs`): a relay is an IN side and an OUT side joined by
  its capacity; a link is an arc OUT -> next IN (the data node's `source` ->
  a first-stage IN, a last-stage OUT -> its `sink`) of the smaller
  capacity of its ends and the link's integer cost, each with its residual
  reverse at the head; the arc sink -> source of cost -`bound` (above any augmenting path's cost)
  makes the min-cost circulation the min-cost maximum flow.  Costs are
  scaled by `alpha` (more than the number of sides), so the last phase
  (epsilon 1) leaves the flows exactly optimal;
* a phase starts by saturating the arcs whose reduced cost is below minus
  its epsilon (the flows are then epsilon-optimal; the arcs within epsilon
  of 0 keep their flow);
* a push across nodes is one `ScalePush` carrying the tail's price, and a
  relabel goes in a `ScalePrice` to the neighbouring nodes that can push to
  the side (`tells`: the reverse arc has room), in every phase
  (`EAGER_PHASES`); a node pushes on the prices it last heard, and a push
  the head finds not admissible is refused with its price (`ScaleRefuse`).
  A push refused after its tail relabelled past the arc is admissible by
  more than epsilon and goes out again at once;
* the data node runs the phases: `ScalePhase` to every node, and a phase ends
  when all of its credit is back (Huang's weight throwing: credit rides on
  pushes and refusals, and a node that sends nothing returns it in a
  `ScaleCredit`); `ScaleDone` ends the last.

`ScaledFormation` (flow/scaled.py) runs a node's machine to its end and
hands the flows to the flow machine.  Pure: the driver hands in `now`.
"""

from __future__ import annotations

import collections
from dataclasses import replace
from fractions import Fraction

from ..effects import Effect, Send
from ..scalemsgs import UPSTREAM, ScaleAbort, ScaleCredit, ScaleDone, ScalePhase, ScalePrice, ScalePush, ScaleRefuse
from .config import FlowConfig

COST_QUANTUM_MS = 0.1  # the daemon's link costs (ms) in whole units of this for cost scaling (`quantized`)
BOUND_MARGIN = 2  # how much dearer than the data node's own links a path's links may be (`leading`)
# the phases whose relabels are told (`ScalePrice`), every phase: prices heard late make pushes that are refused
# (8,273 refusals for 11,276 pushes in the first phase at 160 x 16 when none is told), and chains of refusals make
# the phases long; told in every phase, formation at 160 / 1000 x 16 ends 2.9 / 3.3 x sooner than with the first
# phase's told alone, for 1.5 / 1.4 x the messages (seed 0; docs/bench_flow.md, "Scaled formation")
EAGER_PHASES = 64  # more than any formation's phases (the logarithm of the largest cost x alpha)


def node_of(side: tuple) -> str:
    """The node a side belongs to: a relay's IN and OUT sides, the data node's source and sink."""
    return side[1]


def own_arcs(cfg: FlowConfig, bound: int, caps: dict[str, int] | None = None) -> dict:
    """The residual arcs whose tail is one of `cfg`'s node's sides, arc -> [capacity, integer cost] (module doc),
    a link's reverse arc with the link's capacity third (what the upstream end holds: `ScalingMachine.tells`);
    `bound`: the cost of the arc sink -> source, negated.  `caps`: the neighbours' capacities where known; a link
    carries at most the smaller of its ends' (more would only be pushed back).  Link costs must be integers."""
    me, cap = cfg.node_id, cfg.capacity
    caps = caps or {}
    if len(cfg.commodities) != 1:
        raise ValueError(f"scaled formation takes one data node, not {len(cfg.commodities)}")
    arcs: dict = {}

    def cost(peer: str, costs: dict) -> int:
        k = costs[peer]
        if k != int(k):
            raise ValueError(f"scaled formation needs integer link costs: {k} on {me} - {peer}")
        return int(k)

    def room(peer: str) -> int:  # the link's capacity: the smaller of its ends'
        return min(cap, caps.get(peer, cap))

    data = set(cfg.commodities)
    if cfg.is_data:
        src, snk = ("source", me), ("sink", me)
        arcs[(snk, src)], arcs[(src, snk)] = [cap, -bound], [0, bound]
        for j in cfg.next_costs:
            arcs[(src, ("in", j))] = [room(j), cost(j, cfg.next_costs)]
        for p in cfg.prev_costs:
            arcs[(snk, ("out", p))] = [0, -cost(p, cfg.prev_costs), room(p)]
        return arcs
    inn, out = ("in", me), ("out", me)
    arcs[(inn, out)], arcs[(out, inn)] = [cap, 0], [0, 0]
    for j in cfg.next_costs:
        arcs[(out, ("sink", j) if j in data else ("in", j))] = [room(j), cost(j, cfg.next_costs)]
    for p in cfg.prev_costs:
        arcs[(inn, ("source", p) if p in data else ("out", p))] = [0, -cost(p, cfg.prev_costs), room(p)]
    return arcs


def leading(cfg: FlowConfig, nodes: int, stages: int, factor: int = 2) -> tuple[int, int, int]:
    """What the data node (`cfg`) opens formation with, from what it knows: (`alpha`, `bound`, the epsilon before
    the first phase).  `alpha` is one more than the sides of `nodes` nodes (with room for as many again that
    it does not know of); the largest link cost `top` is its own links' (the others' are not known to it), and
    `bound` = 1 + (stages + 1) x `BOUND_MARGIN` x `top`: a path of links dearer than its own is still cheaper
    than the arc sink -> source is dear.  The first phase's epsilon is `top`."""
    top = max((int(k) for k in (*cfg.next_costs.values(), *cfg.prev_costs.values())), default=1) or 1
    alpha = 4 * nodes + 1
    return alpha, 1 + (stages + 1) * BOUND_MARGIN * top, top * alpha * factor


def quantized(cfg: FlowConfig, quantum: float = COST_QUANTUM_MS) -> FlowConfig:
    """`cfg` with its link costs in whole `quantum`s: cost scaling takes integers, the daemon measures ms."""
    def whole(costs: dict) -> dict:
        return {p: int(round(c / quantum)) for p, c in costs.items()}
    return replace(cfg, next_costs=whole(cfg.next_costs), prev_costs=whole(cfg.prev_costs))


def machine_for(cfg: FlowConfig, caps: dict[str, int], peers: tuple[str, ...], stages: int,
                factor: int = 2, eager_phases: int = EAGER_PHASES) -> ScalingMachine:
    """A node's scaling machine over its links (`cfg`, integer costs; `caps` its neighbours' capacities), as the
    daemon and the simulator build it.  The data node opens formation (`leading`) and runs its phases with
    `peers`, every other node it knows of; the others learn the cost factor from the first phase.  In the first
    `eager_phases` phases a relabel is told to the neighbours (`ScalePrice`)."""
    data = cfg.commodities[0] if cfg.commodities else ""
    if not cfg.is_data:
        return ScalingMachine(cfg.node_id, own_arcs(cfg, 0, caps), data, factor, eager_phases)
    alpha, bound, eps = leading(cfg, len(peers) + 1, stages, factor)
    return ScalingMachine(cfg.node_id, own_arcs(cfg, bound, caps), data, factor, eager_phases, alpha=alpha, eps=eps,
                          peers=peers)


class ScalingMachine:
    """One node's sides, their prices and the residual arcs they are the tail of; the data node also runs the
    phases and collects the credit."""

    def __init__(self, node_id: str, own: dict, data: str, factor: int = 2, eager_phases: int = 0,
                 alpha: int | None = None, eps: int = 0, peers: tuple = ()) -> None:
        """`own`: the arcs whose tail is one of this node's sides (arc -> [capacity, cost]); their costs are scaled
        by `alpha`, the data node's, here or at the first `ScalePhase`.  The data node also gets the epsilon
        before its first phase (divided by `factor` for it) and every other node (`peers`)."""
        self.id, self.data, self.factor, self.eager_phases = node_id, data, factor, eager_phases
        self.relabelled: set = set()  # sides whose new price goes out with this handler's messages (eager phases)
        self.received: collections.Counter = collections.Counter()  # (phase, message type) -> messages received
        self.started: list = []  # the data node: (time, epsilon) of each phase's start
        self.sides = {u for u, _ in own}
        self.given = {a: arc[0] for a, arc in own.items()}
        self.raw = {a: arc[1] for a, arc in own.items()}
        self.room = {a: arc[2] for a, arc in own.items() if len(arc) > 2}  # a reverse arc -> its link's capacity
        self.cap = dict(self.given)
        self.cost: dict = {}
        self.alpha: int | None = None
        if alpha is not None:
            self.scale(alpha)
        self.adj: dict = collections.defaultdict(list)
        for u, v in self.cap:
            self.adj[u].append(v)
        self.price = dict.fromkeys(self.sides, 0)
        self.excess = dict.fromkeys(self.sides, 0)
        self.heard: dict = {}  # (own side, foreign side) -> the foreign side's price as last heard
        self.eps, self.peers = eps, tuple(peers)
        self.credit, self.returned, self.phase = Fraction(0), Fraction(0), 0
        self.done: float | None = None  # the time of ScaleDone
        self.ignored = 0  # messages that name no arc of this node, or come from a node that may not send them

    def scale(self, alpha: int) -> None:
        self.alpha = alpha
        self.cost = {a: k * alpha for a, k in self.raw.items()}

    def known(self, u, v) -> int:
        return self.price[v] if v in self.sides else self.heard.get((u, v), 0)

    def start(self, now: float) -> list[Effect]:
        return self._next_phase(now) if self.id == self.data else []

    def fits(self, sender: str, msg) -> bool:
        """Whether `msg` from `sender` is one this node can take: a push or refusal over one of its arcs from the
        node at the arc's other end, the phases, their end and the credit only between the data node and the
        others."""
        if isinstance(msg, ScalePush):
            return ((msg.head, self.id), (msg.tail, sender)) in self.cap and msg.amount > 0
        if isinstance(msg, ScaleRefuse):
            return ((msg.tail, self.id), (msg.head, sender)) in self.cap and msg.amount > 0
        if isinstance(msg, (ScalePhase, ScaleDone)):
            return sender == self.data
        if isinstance(msg, ScaleCredit):
            return self.id == self.data
        if isinstance(msg, ScaleAbort):
            return sender == self.data or self.id == self.data
        return True

    def on_message(self, now: float, sender: str, msg) -> list[Effect]:
        """A formation message (`fits` checked; `alpha` known: flow/scaled.py's `ScaledFormation` holds the others
        until the first `ScalePhase`)."""
        self.received[(self.phase, type(msg).__name__)] += 1
        if isinstance(msg, ScalePrice):
            side = (msg.side, sender)
            for own in self.sides:
                if (own, side) in self.cap and self.heard.get((own, side), 0) > msg.price:
                    self.heard[(own, side)] = msg.price
            return []
        if isinstance(msg, ScaleDone):
            self.done = now
            return []
        self.credit += Fraction(msg.credit)
        if isinstance(msg, ScaleCredit):
            return self._settle(now, [])
        out = self._enter(msg.number if isinstance(msg, ScalePhase) else msg.phase, msg.eps)
        if isinstance(msg, ScalePush):
            tail, head = (msg.tail, sender), (msg.head, self.id)
            self.heard[(head, tail)] = msg.price
            if msg.tail in UPSTREAM:
                self._link_cost((head, tail), msg.cost)
            if -self.cost[(head, tail)] + msg.price - self.price[head] >= 0:
                out.append((sender, ScaleRefuse(msg.tail, msg.head, msg.amount, self.price[head], self.phase,
                                                self.eps, "0", cost=self._upstream_cost(head, tail))))
            else:
                self.cap[(head, tail)] += msg.amount
                self.excess[head] += msg.amount
        elif isinstance(msg, ScaleRefuse) and msg.gone:  # the head has no such link: the arc goes
            tail, head = (msg.tail, self.id), (msg.head, sender)
            self.excess[tail] += msg.amount
            self.cap[(tail, head)] = self.given[(tail, head)] = self.room[(tail, head)] = 0  # (nothing told over it)
        elif isinstance(msg, ScaleRefuse):
            tail, head = (msg.tail, self.id), (msg.head, sender)
            self.heard[(tail, head)] = msg.price
            if msg.head in UPSTREAM:
                self._link_cost((tail, head), msg.cost)
            self.cap[(tail, head)] += msg.amount
            self.excess[tail] += msg.amount
            if self.cost[(tail, head)] + self.price[tail] - msg.price < 0:
                # the tail relabelled while its push was out, past an arc it had saturated: the arc is
                # admissible now, and left residual it could break epsilon-optimality, so it goes out again
                self._move(tail, head, msg.amount, out)
        return self._settle(now, out + self._discharge())

    def decline(self, now: float, sender: str, msg: ScalePush) -> list[Effect]:
        """A push over a link this node does not have (its links were measured without the sender's: the daemon's
        nodes measure theirs at their own times): the units go back, the sender drops the arc, and the push's
        credit goes on with the refusal."""
        self.credit += Fraction(msg.credit)
        out = self._enter(msg.phase, msg.eps)
        out.append((sender, ScaleRefuse(msg.tail, msg.head, msg.amount, 0, self.phase, self.eps, "0", True)))
        return self._settle(now, out + self._discharge())

    def tells(self, u, v) -> bool:
        """Whether side `u`'s new price goes to `v`'s node: only where `v` has a residual arc to `u`, the reverse
        of a link `u` sends flow on, or a link into `u` with room left (one whose room is not known, always).  Over
        any other arc `v` never pushes to `u` before `u` pushes to it, and that push carries `u`'s price."""
        if self.given[(u, v)] > 0:
            return self.cap[(u, v)] < self.given[(u, v)]
        return (u, v) not in self.room or self.cap[(u, v)] < self.room[(u, v)]

    def flows(self) -> dict:
        """The flow on each arc of positive given capacity (its tail is this node's)."""
        return {a: c - self.cap[a] for a, c in self.given.items() if c > 0}

    def units(self) -> tuple[dict, dict]:
        """(inn, out): the units received from each upstream node and sent to each downstream node, the flow
        machine's counts (`FlowNode.adopt`, per commodity: this formation's data node)."""
        inn: dict = collections.Counter()
        out: dict = collections.Counter()
        for (u, v), c in self.given.items():
            if node_of(v) == self.id:
                continue
            if c > 0:
                out[node_of(v)] += c - self.cap[(u, v)]
            else:
                inn[node_of(v)] += self.cap[(u, v)]
        return {self.data: dict(+inn)}, {self.data: dict(+out)}

    def _move(self, u, v, amount: int, out: list) -> None:
        self.cap[(u, v)] -= amount
        self.excess[u] -= amount
        if v in self.sides:
            self.cap[(v, u)] += amount
            self.excess[v] += amount
        else:
            out.append((node_of(v), ScalePush(u[0], v[0], amount, self.price[u], self.phase, self.eps, "0",
                                              self._upstream_cost(u, v))))

    def _enter(self, number: int, eps: int) -> list:
        """A message of phase `number`: a phase this node had not started starts now, saturating every arc of
        negative reduced cost (its pushes returned)."""
        if number <= self.phase:
            return []
        self.eps, self.phase = eps, number
        return self._saturate()

    def _upstream_cost(self, u, v) -> int:
        """The link's cost a message from side `u` to `v` carries: the link's, where `u` is its upstream end."""
        return self.raw[(u, v)] if u[0] in UPSTREAM else 0

    def _link_cost(self, arc, cost: int) -> None:
        """The upstream end holds the link at `cost`: so does this end, on its residual arc `arc` (the reverse)."""
        self.raw[arc] = -cost
        self.cost[arc] = -cost * self.alpha

    def _saturate(self) -> list:
        out: list = []
        for (u, v), c in list(self.cap.items()):
            if c > 0 and self.cost[(u, v)] + self.price[u] - self.known(u, v) < -self.eps:
                self._move(u, v, c, out)
        return out

    def _discharge(self) -> list:
        out: list = []
        busy = [u for u in self.sides if self.excess[u] > 0]
        while busy:
            u = busy.pop()
            while self.excess[u] > 0:
                ok = [v for v in self.adj[u] if self.cap[(u, v)] > 0
                      and self.cost[(u, v)] + self.price[u] - self.known(u, v) < 0]
                if not ok:  # relabel on the prices it knows
                    self.price[u] = max(self.known(u, v) - self.cost[(u, v)]
                                        for v in self.adj[u] if self.cap[(u, v)] > 0) - self.eps
                    if self.phase <= self.eager_phases:
                        self.relabelled.add(u)
                    continue
                for v in ok:
                    self._move(u, v, min(self.excess[u], self.cap[(u, v)]), out)
                    if v in self.sides and self.excess[v] > 0:
                        busy.append(v)
                    if self.excess[u] == 0:
                        break
        return out

    def _settle(self, now: float, out: list) -> list[Effect]:
        """Send `out` ((node, message) pairs) with this node's credit split over it; with nothing to send, hand the
        credit back (the data node counts it as returned)."""
        share = self.credit / len(out) if out else self.credit
        sends = [Send(to, replace(m, credit=str(share))) for to, m in out]
        if not out and self.id == self.data:
            self.returned += share
        elif not out and share:
            sends.append(Send(self.data, ScaleCredit(str(share))))
        self.credit = Fraction(0)
        for u in sorted(self.relabelled):
            sends += [Send(m, ScalePrice(u[0], self.price[u]))
                      for m in sorted({node_of(v) for v in self.adj[u] if self.tells(u, v)} - {self.id})]
        self.relabelled.clear()
        if self.id == self.data and self.returned == 1:
            return sends + self._next_phase(now)
        return sends

    def _next_phase(self, now: float) -> list[Effect]:
        if self.eps <= 1 and self.phase:
            self.done = now
            return [Send(p, ScaleDone(self.phase)) for p in self.peers]
        self.eps, self.phase, self.returned = max(1, self.eps // self.factor), self.phase + 1, Fraction(0)
        self.started.append((now, self.eps))
        share = Fraction(1, len(self.peers) + 1)
        self.credit = share
        sends = [Send(p, ScalePhase(self.phase, self.eps, str(share), self.alpha)) for p in self.peers]
        return sends + self._settle(now, self._saturate() + self._discharge())
