#!/usr/bin/env python3
"""Cost scaling against label waves: the messages per node of a min-cost flow without waves, one data node.

The flow machines' label waves recompute every label once per augmentation cost, so a node's messages grow with
the units of the swarm (docs/bench_flow.md, "How few messages label waves can reach").  This benchmark runs the
other classic exact algorithm, Goldberg-Tarjan cost scaling (`refine` with FIFO push/relabel on the min-cost
circulation), centrally on the instances of `bench_flow_scale.py` and counts what a distributed version would
send at the least, next to what the flow machines send on the same instance (`--machines`):

* the network: a relay is an IN side and an OUT side joined by an arc of its capacity; a link (previous-stage
  OUT -> next-stage IN, the data node's source -> first stage, last stage -> its sink) carries at most the
  smaller capacity of its relays; an arc sink -> source of cost -M makes the min-cost circulation the min-cost
  maximum flow as long as no augmenting path costs M or more.  M is 1 + (stages + 1) x the largest link cost,
  above any path's own cost; a rerouting chain could cost more, so the units are always checked against the
  maximum flow (`max_flow`, networkx; equal on every instance measured).  Link costs must be integers (setting 1's are 1-20); they are
  scaled by the number of sides + 1, so the last phase (epsilon 1) leaves the flows exactly optimal;
* a push across machines is one message and carries the sender's price.  With lazy prices (the default) a
  relabel tells nobody: a machine pushes on the prices it last heard, and a push that the receiver finds not
  admissible (its true reduced cost is not negative) is refused with the receiver's price, a second message.
  With `--eager` every relabel tells the new price to every neighbouring machine, and no push is refused;
* each phase costs 2 messages a machine (its start and its end along a tree).  A termination detection that
  acknowledges every message (Dijkstra-Scholten) would add one a push; the counts leave it out.

The IN and OUT sides of a relay, and the data node's source and sink, are one machine: nothing between them is
counted.  The order is the sequential FIFO order, so the counts are a floor for the distributed version, as the
`--bound` columns of `bench_flow_scale.py` are for label waves.

`--distributed` runs the distributed version instead: one `ScalingMachine` a node in the simulator
(sim/engine.py, message delays the links'), asynchronous, with lazy prices as above (`--eager`, or
`--eager-phases N` for the first N phases: a relabel's price also goes to every neighbouring machine in a
`Price`, which sets no work going and so carries no credit).  The data node runs the
phases: it tells every node each phase's epsilon (`Phase`), a node that hears of a phase first from a push
starts it then, and a phase ends when all of its credit is back at the data node (Huang's weight throwing: a
node's credit rides on the pushes and refusals it sends, and a node that sends nothing hands it back in a
`Credit`); `Done` tells every node that the flows are final.  Every message is counted, and `formed_s` is the
virtual time of the last phase's end, next to the flow machines' converged time (`--machines`); the JSON's
`per_phase` gives each phase's epsilon in link-cost units, its virtual seconds, and the messages received while
the receiver was in it.

    python scripts/bench_cost_scaling.py                                  # 160, 320, 1000 relays, K = 10
    python scripts/bench_cost_scaling.py --relays 160 1000 --machines     # with the flow machines side by side
    python scripts/bench_cost_scaling.py --relays 160 1000 --neighbours 0 --eager --json
    python scripts/bench_cost_scaling.py --distributed --machines         # the machines in the simulator
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from dataclasses import dataclass, replace
from fractions import Fraction

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.flow import FlowConfig
from gwtf_node.protocol.neighbourhood import bound_links
from gwtf_node.protocol.scenario import Scenario, parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.engine import Simulator
from gwtf_node.sim.flowsim import link_delays, run_gwtf
from gwtf_node.sim.scenarios import FlowSetting, generate_layered


def circulation(sc: Scenario) -> tuple[dict, tuple]:
    """`sc` (one data node) as a circulation network: arc -> [capacity, integer cost], every arc with its
    reverse (capacity 0); and the arc sink -> source whose flow is the units placed."""
    (data,) = [n.id for n in sc.data_nodes]
    source, sink = ("source", data), ("sink", data)
    cap = {n.id: n.capacity for n in sc.relays}
    stage = {n.id: n.stage for n in sc.relays}
    arcs: dict = {}

    def arc(u, v, c, cost):
        if cost != int(cost):
            raise SystemExit(f"cost scaling needs integer link costs: {cost} on {u} -> {v}")
        arcs[(u, v)] = [c, int(cost)]
        arcs.setdefault((v, u), [0, -int(cost)])

    for r, c in cap.items():
        arc(("in", r), ("out", r), c, 0)
    top = 0
    for link in sc.links:
        ends = sorted((link.a, link.b), key=lambda x: stage.get(x, -1))
        if ends[0] == data:
            r = ends[1]
            if stage[r] == 0:
                arc(source, ("in", r), cap[r], link.cost)
            if stage[r] == sc.stages - 1:
                arc(("out", r), sink, cap[r], link.cost)
        elif stage[ends[1]] == stage[ends[0]] + 1:
            arc(("out", ends[0]), ("in", ends[1]), min(cap[ends[0]], cap[ends[1]]), link.cost)
        else:
            continue
        top = max(top, int(link.cost))
    back = (sink, source)
    arc(sink, source, sum(c for (u, _), (c, _) in arcs.items() if u == source), -(1 + (sc.stages + 1) * top))
    return arcs, back


def opening(arcs: dict, alpha: int, first_eps: int | None, factor: int) -> int:
    """The epsilon before the first phase (which divides it by `factor`): `first_eps` link-cost units, by default
    the largest link cost, on the scaled costs.  Refine starts by saturating every arc of negative reduced cost,
    so it needs no epsilon-optimal start, and the circulation arc's -M is left out."""
    top = first_eps or max((k for c, k in arcs.values() if c > 0 and k > 0), default=1)
    return top * alpha * factor


def machine(side: tuple) -> str:
    """The node a side belongs to: a relay's IN and OUT sides, the data node's source and sink."""
    return side[1]


def cost_scaling(sc: Scenario, factor: int = 2, eager: bool = False, first_eps: int | None = None) -> dict:
    """Min-cost maximum flow of `sc` by cost scaling (module doc); what it placed, its cost, and the messages."""
    arcs, back = circulation(sc)
    adj = collections.defaultdict(list)
    for u, v in arcs:
        adj[u].append(v)
    alpha = len(adj) + 1
    cost = {a: c * alpha for a, (_, c) in arcs.items()}
    cap = {a: c for a, (c, _) in arcs.items()}
    price = dict.fromkeys(adj, 0)
    heard: dict = {}  # (side, neighbour side) -> the neighbour's price as the side's machine last heard it
    told = {u: {machine(v) for v in adj[u]} - {machine(u)} for u in adj}
    excess: dict = collections.defaultdict(int)
    count = collections.Counter()

    def known(u, v):
        return price[v] if eager or machine(u) == machine(v) else heard.get((u, v), 0)

    def push(u, v, amount) -> bool:
        if machine(u) != machine(v):
            count["pushes"] += 1
            heard[(v, u)] = price[u]
            if cost[(u, v)] + price[u] - price[v] >= 0:  # stale price: refused, with the receiver's price
                count["refused"] += 1
                heard[(u, v)] = price[v]
                return False
        cap[(u, v)] -= amount
        cap[(v, u)] += amount
        excess[u] -= amount
        excess[v] += amount
        return True

    def admissible(u):
        return [v for v in adj[u] if cap[(u, v)] > 0 and cost[(u, v)] + price[u] - known(u, v) < 0]

    eps, phases = opening(arcs, alpha, first_eps, factor), 0
    while eps > 1:
        eps, phases = max(1, eps // factor), phases + 1
        for (u, v) in list(cost):
            if cap[(u, v)] > 0 and cost[(u, v)] + price[u] - known(u, v) < 0:
                push(u, v, cap[(u, v)])
        queue = collections.deque(u for u in adj if excess[u] > 0)
        waiting = set(queue)
        while queue:
            u = queue.popleft()
            waiting.discard(u)
            while excess[u] > 0:
                for v in admissible(u):
                    if push(u, v, min(excess[u], cap[(u, v)])) and excess[v] > 0 and v not in waiting:
                        queue.append(v)
                        waiting.add(v)
                    if excess[u] == 0:
                        break
                if excess[u] > 0 and not admissible(u):  # none left on the prices it knows: relabel
                    price[u] = max(known(u, v) - cost[(u, v)] for v in adj[u] if cap[(u, v)] > 0) - eps
                    count["relabels"] += 1
                    if eager:
                        count["price_tells"] += len(told[u])
    machines = len({machine(u) for u in adj})
    # the certificate: every residual arc's reduced cost at least -1 (epsilon 1 on costs scaled by alpha)
    certified = all(cost[a] + price[a[0]] - price[a[1]] >= -1 for a in cost if cap[a] > 0)
    sent = count["pushes"] + count["refused"] + count["price_tells"] + 2 * machines * phases
    units = arcs[back][0] - cap[back]
    total = sum((full - cap[a]) * c for a, (full, c) in arcs.items() if full > 0 and a != back)
    return {"units": units, "total_cost": total, "certified": certified, "phases": phases, "messages": sent,
            "per_node": round(sent / machines, 1), "refused_per_node": round(count["refused"] / machines, 1),
            "pushes_per_node": round(count["pushes"] / machines, 1),
            "relabels_per_node": round(count["relabels"] / machines, 1)}


# --- distributed: one machine a node in the simulator (`--distributed`) ------------------------------------------


@dataclass(frozen=True)
class Phase:  # the data node to every machine: refine with this epsilon; and a share of the phase's credit
    number: int
    eps: int
    credit: Fraction


@dataclass(frozen=True)
class Push:  # `amount` along the residual arc tail -> head, at the tail's price
    tail: tuple
    head: tuple
    amount: int
    price: int
    phase: int  # a machine that hears of a phase first from a push or refusal starts it then
    eps: int
    credit: Fraction


@dataclass(frozen=True)
class Refuse:  # the push came on a stale price: the amount goes back, with the head's price
    tail: tuple
    head: tuple
    amount: int
    price: int
    phase: int
    eps: int
    credit: Fraction


@dataclass(frozen=True)
class Credit:  # a machine with nothing left to do hands its credit back to the data node
    credit: Fraction


@dataclass(frozen=True)
class Done:  # the data node to every machine: the last phase ended, the flows are final
    phases: int


@dataclass(frozen=True)
class Price:  # eager prices (`eager_phases`): a side's new price, told to every neighbouring machine after a relabel
    side: tuple
    price: int


class ScalingMachine:
    """One node's sides, their prices and the residual arcs they are the tail of; the data node also runs the
    phases and collects the credit (Huang's weight throwing: a phase ends when all of it is back)."""

    def __init__(self, node_id: str, own: dict, alpha: int, data: str, factor: int, eager_phases: int = 0,
                 eps: int = 0, peers: tuple = ()) -> None:
        """`own`: the arcs whose tail is one of this node's sides (arc -> [capacity, cost]), costs scaled by
        `alpha`; the data node also gets the epsilon before the first phase and every other node (`peers`)."""
        self.id, self.data, self.factor, self.eager_phases = node_id, data, factor, eager_phases
        self.relabelled: set = set()  # sides whose new price goes out with this handler's messages (eager phases)
        self.received: collections.Counter = collections.Counter()  # (phase, message type) -> messages received
        self.started: list = []  # the data node: the virtual time each phase started
        self.sides = {u for u, _ in own}
        self.cap = {a: c for a, (c, _) in own.items()}
        self.cost = {a: k * alpha for a, (_, k) in own.items()}
        self.adj: dict = collections.defaultdict(list)
        for u, v in self.cap:
            self.adj[u].append(v)
        self.price = dict.fromkeys(self.sides, 0)
        self.excess = dict.fromkeys(self.sides, 0)
        self.heard: dict = {}  # (own side, foreign side) -> the foreign side's price as last heard
        self.eps, self.peers = eps, peers
        self.credit, self.returned, self.phase = Fraction(0), Fraction(0), 0
        self.done = None  # the virtual time of Done

    def known(self, u, v) -> int:
        return self.price[v] if v in self.sides else self.heard.get((u, v), 0)

    def start(self, now: float) -> list:
        return self._next_phase(now) if self.id == self.data else []

    def on_timer(self, now: float, key: str) -> list:
        return []

    def on_message(self, now: float, sender: str, msg) -> list:
        self.received[(self.phase, type(msg).__name__)] += 1
        if isinstance(msg, Price):  # no work comes of it, so it carries no credit
            for own in self.sides:
                if (own, msg.side) in self.cap and self.heard.get((own, msg.side), 0) > msg.price:
                    self.heard[(own, msg.side)] = msg.price
            return []
        if isinstance(msg, Done):
            self.done = now
            return []
        self.credit += msg.credit
        if isinstance(msg, Credit):
            return self._settle(now, [])
        out = []
        number, eps = (msg.number, msg.eps) if isinstance(msg, Phase) else (msg.phase, msg.eps)
        if number > self.phase:  # a new phase: saturate every arc of negative reduced cost
            self.eps, self.phase = eps, number
            out = self._saturate()
        if isinstance(msg, Push):
            self.heard[(msg.head, msg.tail)] = msg.price
            if -self.cost[(msg.head, msg.tail)] + msg.price - self.price[msg.head] >= 0:
                out.append(Refuse(msg.tail, msg.head, msg.amount, self.price[msg.head], self.phase, self.eps,
                                  Fraction(0)))
            else:
                self.cap[(msg.head, msg.tail)] += msg.amount
                self.excess[msg.head] += msg.amount
        elif isinstance(msg, Refuse):
            self.heard[(msg.tail, msg.head)] = msg.price
            self.cap[(msg.tail, msg.head)] += msg.amount
            self.excess[msg.tail] += msg.amount
            if self.cost[(msg.tail, msg.head)] + self.price[msg.tail] - msg.price < 0:
                # the tail relabelled while its push was out, past an arc it had saturated: the arc is
                # admissible now, and left residual it could break epsilon-optimality, so it goes out again
                self._move(msg.tail, msg.head, msg.amount, out)
        return self._settle(now, out + self._discharge())

    def _move(self, u, v, amount: int, out: list) -> None:
        self.cap[(u, v)] -= amount
        self.excess[u] -= amount
        if v in self.sides:
            self.cap[(v, u)] += amount
            self.excess[v] += amount
        else:
            out.append(Push(u, v, amount, self.price[u], self.phase, self.eps, Fraction(0)))

    def _saturate(self) -> list:
        out: list = []
        for (u, v), c in list(self.cap.items()):
            if c > 0 and self.cost[(u, v)] + self.price[u] - self.known(u, v) < 0:
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

    def _settle(self, now: float, out: list) -> list:
        """Send `out` with this machine's credit split over it; with nothing to send, hand the credit back (the
        data node counts it as returned)."""
        share = self.credit / len(out) if out else self.credit
        sends = [Send(machine(m.head if isinstance(m, Push) else m.tail), replace(m, credit=share)) for m in out]
        if not out and self.id == self.data:
            self.returned += share
        elif not out and share:
            sends.append(Send(self.data, Credit(share)))
        self.credit = Fraction(0)
        for u in sorted(self.relabelled):
            sends += [Send(m, Price(u, self.price[u])) for m in sorted({machine(v) for v in self.adj[u]} - {self.id})]
        self.relabelled.clear()
        if self.id == self.data and self.returned == 1:
            return sends + self._next_phase(now)
        return sends

    def _next_phase(self, now: float) -> list:
        if self.eps <= 1 and self.phase:
            self.done = now
            return [Send(p, Done(self.phase)) for p in self.peers]
        self.eps, self.phase, self.returned = max(1, self.eps // self.factor), self.phase + 1, Fraction(0)
        self.started.append((now, self.eps))
        share = Fraction(1, len(self.peers) + 1)
        self.credit = share
        sends = [Send(p, Phase(self.phase, self.eps, share)) for p in self.peers]
        return sends + self._settle(now, self._saturate() + self._discharge())


def distributed(sc: Scenario, factor: int = 2, first_eps: int | None = None, eager_phases: int = 0) -> dict:
    """Cost scaling by one `ScalingMachine` a node in the simulator (message delays: the links'); what it placed,
    its cost, the messages by type and the virtual time the flows were final."""
    arcs, back = circulation(sc)
    (data,) = [n.id for n in sc.data_nodes]
    sim = Simulator(link_delays(sc))
    alpha = len({u for u, _ in arcs}) + 1
    own: dict = collections.defaultdict(dict)  # each node's arcs, by the machine of their tail
    for a, arc in arcs.items():
        own[machine(a[0])][a] = arc
    nodes = {n.id: ScalingMachine(n.id, own[n.id], alpha, data, factor, eager_phases) for n in sc.nodes}
    nodes[data] = ScalingMachine(data, own[data], alpha, data, factor, eager_phases,
                                 opening(arcs, alpha, first_eps, factor), tuple(sorted(set(nodes) - {data})))
    for nid in sorted(nodes):
        sim.add(nid, nodes[nid])
    sim.start_all()
    sim.run_until(float("inf"))
    flow = {}
    for m in nodes.values():
        flow.update({a: arcs[a][0] - c for a, c in m.cap.items() if arcs[a][0] > 0})
    units = flow[back]
    total = sum(f * arcs[a][1] for a, f in flow.items() if a != back)
    price = {u: p for m in nodes.values() for u, p in m.price.items()}
    certified = all(m.cost[a] + price[a[0]] - price[a[1]] >= -1 for m in nodes.values() for a, c in m.cap.items() if c)
    n, by_type = len(nodes), sim.stats.messages_by_type
    received = sum((m.received for m in nodes.values()), collections.Counter())
    ends = [t for t, _ in nodes[data].started[1:]] + [nodes[data].done]
    per_phase = [{"eps": round(e / alpha, 3), "s": round(end - t, 1),
                  "received": {k: v for (p, k), v in sorted(received.items()) if p == i}}
                 for i, ((t, e), end) in enumerate(zip(nodes[data].started, ends), 1) if end is not None]
    return {"units": units, "total_cost": total, "certified": certified, "phases": nodes[data].phase,
            "messages": sim.stats.messages, "per_node": round(sim.stats.messages / n, 1),
            "refused_per_node": round(by_type.get("Refuse", 0) / n, 1), "formed_s": None if nodes[data].done is None else round(nodes[data].done, 1),
            "by_type": dict(sorted(by_type.items())), "per_phase": per_phase,
            "by_type_per_node": {k: round(v / n, 1) for k, v in sorted(by_type.items())}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relays", type=int, nargs="+", default=[160, 320, 1000])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--neighbours", type=int, default=10, metavar="K",
                    help="bound each relay's flow links to K (protocol/neighbourhood.py; 0: every link)")
    ap.add_argument("--factor", type=int, default=2, help="epsilon is divided by this each phase")
    ap.add_argument("--first-eps", type=int, default=None, metavar="E",
                    help="the first phase's epsilon, in link-cost units (default: the largest link cost)")
    ap.add_argument("--eager", action="store_true", help="every relabel tells every neighbouring machine")
    ap.add_argument("--eager-phases", type=int, default=0, metavar="N",
                    help="--distributed: a relabel in phases 1-N tells every neighbouring machine (`Price`)")
    ap.add_argument("--distributed", action="store_true",
                    help="run one machine a node in the simulator (`ScalingMachine`) instead of the central count")
    ap.add_argument("--machines", action="store_true", help="also run the flow machines (label waves) side by side")
    ap.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    args = ap.parse_args(argv)
    if args.factor < 2:
        ap.error("--factor must be at least 2")
    if args.first_eps is not None and args.first_eps < 1:
        ap.error("--first-eps must be at least 1")
    if args.eager_phases and not args.distributed:
        ap.error("--eager-phases is for --distributed (the central count's --eager tells every relabel)")
    if not args.json:
        print("| relays x stages | units / max flow | cost / optimum | phases | per node | refused per node "
              "| flow machines per node | cost scaling / flow machines | formed s (flow machines) |")
        print("|---|---|---|---|---|---|---|---|---|")
    first = None
    for n in args.relays:
        sc = bound_links(parse_scenario(generate_layered(
            f"scale-{n}x{args.stages}", FlowSetting(1, n, args.stages, (1, 3), (1, 20)), args.seed)), args.neighbours)
        opt = optimal_routing(sc)
        t = time.process_time()
        if args.distributed:
            got = distributed(sc, args.factor, args.first_eps, 10 ** 6 if args.eager else args.eager_phases)
        else:
            got = cost_scaling(sc, args.factor, args.eager, args.first_eps)
        got["cpu_s"] = round(time.process_time() - t, 1)
        got["cost_ratio"] = round(got["total_cost"] / (opt.mean_cost * opt.num_flows), 6) if opt.num_flows else 1.0
        waves = None
        if args.machines:
            g = run_gwtf(sc, seed=args.seed, neighbours=args.neighbours)
            waves = round(g.messages / len(sc.nodes), 1)
            got["machines_converged_s"] = g.converged_round * FlowConfig.round_s
        first = first or (got["per_node"], waves)
        row = {"relays": n, "stages": args.stages, "neighbours": args.neighbours, "factor": args.factor,
               "first_eps": args.first_eps, "eager_phases": args.eager_phases,
               "eager": args.eager, "max_flow": opt.num_flows, **got, "machines_per_node": waves,
               "growth": round(got["per_node"] / first[0], 2),
               "machines_growth": round(waves / first[1], 2) if waves else None}
        if args.json:
            print(json.dumps(row), flush=True)
            continue
        vs = f"{got['per_node'] / waves:.2f}" if waves else "-"
        machines = f"{waves} ({row['machines_growth']:.2f} x)" if waves else "-"
        print(f"| {n} x {args.stages} | {got['units']} / {opt.num_flows} | {got['cost_ratio']:.4f} | {got['phases']} "
              f"| {got['per_node']:.1f} ({row['growth']:.2f} x) | {got['refused_per_node']:.1f} | {machines} "
              f"| {vs} | {got.get('formed_s') or '-'} ({got.get('machines_converged_s') or '-'}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
