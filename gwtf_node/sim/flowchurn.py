"""Flow machines under churn: relays crash or join after the flows formed, and the flows re-form.

`run_churn` runs the flow machines of a scenario (as `flowsim.run_gwtf`) until
they converge, then applies a `Churn`:

* killed relays stop at once (`Simulator.kill`: their messages already on the
  wire are still delivered; everything sent to them is lost); every survivor
  linked to one (previous / next stage, same-stage peer) gets
  `FlowNode.remove_neighbour` `detect_s` later (the COMPLETE watchdog or the
  membership layer noticing the crash);
* joining relays start a flow machine with the links of the changed scenario
  (`FlowConfig.joined`), and every node linked to one gets
  `FlowNode.add_neighbour` `detect_s` later (the leader's placement reaching
  them).

`run_trickle` lets relays join one by one while the flows form (a swarm whose
volunteers come in over a minute), and reports the routing at the end.

`FlowRun.partition` / `heal` cut a relay off (its messages lost both ways,
each side removing the other once the liveness check would) and bring it
back (each side taking the other back at once, adding the links after
measuring them, possibly at different times).

Then the machines run until no flow has changed for `quiet_rounds` rounds.
Nothing is recomputed globally: the re-formed flows are the machines' own
work.  The result holds the routing before and after, both as
`RoutingResult`s of their own scenario (validate them with
`sim.validate.check_routing`), with the rounds and messages from the churn to
the last flow change.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import TextIO

from ..protocol.effects import Send
from ..protocol.flow import FlowConfig, FlowNode
from ..protocol.neighbourhood import adjacent_relays, auto_choice, bound_links, joiner_links, refill
from ..protocol.scenario import LinkSpec, NodeSpec, Scenario
from .engine import Simulator
from .flowsim import MS, QUIET_ROUNDS_DEFAULT, TracedMachine, extract_flows, flow_configs, scaled_nodes
from .result import RoutingResult


@dataclass(frozen=True)
class Churn:
    kill: tuple[str, ...] = ()  # relay ids that crash
    join: tuple[NodeSpec, ...] = ()  # relays that join (role "relay", with a stage)
    join_links: tuple[LinkSpec, ...] = ()  # the joiners' links (to data nodes, adjacent stages)
    detect_s: float = 1.0  # neighbours learn of a crash / a joiner this long after it


@dataclass
class ChurnResult:
    before: RoutingResult  # on the original scenario
    after: RoutingResult  # on `changed`
    changed: Scenario
    churn_at: float
    reconverge_rounds: float  # from the churn to the last flow change
    messages_after: int  # messages sent from the churn on
    extra: dict = field(default_factory=dict)


def changed_scenario(scenario: Scenario, churn: Churn) -> Scenario:
    """The scenario after the churn: killed relays and their links gone, joiners and their links added."""
    dead = set(churn.kill)
    nodes = tuple(n for n in scenario.nodes if n.id not in dead) + tuple(churn.join)
    links = tuple(l for l in scenario.links if l.a not in dead and l.b not in dead) + tuple(churn.join_links)
    return Scenario(scenario.name + "+churn", scenario.stages, nodes, links, scenario.activation_mb)


def random_churn(scenario: Scenario, rng: random.Random, kill_frac: float = 0.0, joins: int = 0,
                 capacity: tuple[float, float] = (1, 3), link_cost: tuple[float, float] = (1, 20),
                 detect_s: float = 1.0, prefix: str = "j") -> Churn:
    """Kill round(kill_frac x relays) random relays; add `joins` relays to random stages, linked like the
    Table V generator does (data nodes for the first / last stage, every relay of the adjacent stages)."""
    relays = sorted(r.id for r in scenario.relays)
    k = int(round(kill_frac * len(relays)))
    kill = tuple(sorted(rng.sample(relays, k)))
    dead = set(kill)
    s = scenario.stages
    by_stage = {st: [r.id for r in scenario.relays_of_stage(st) if r.id not in dead] for st in range(s)}
    data = [n.id for n in scenario.data_nodes]
    join: list[NodeSpec] = []
    links: list[LinkSpec] = []

    def link(a: str, b: str) -> None:
        c = float(math.floor(rng.uniform(*link_cost)))
        links.append(LinkSpec(a, b, c, (c, c)))

    for j in range(joins):
        st = rng.randrange(s)
        nid = f"{prefix}{st}_{j}"
        join.append(NodeSpec(nid, "relay", int(math.floor(rng.uniform(*capacity))), st))
        ups = data if st == 0 else by_stage[st - 1]
        downs = data if st == s - 1 else by_stage[st + 1]
        for u in ups:
            link(u, nid)
        for v in downs:
            if not (st == 0 and s == 1 and v in ups):
                link(nid, v)
        by_stage[st].append(nid)
    return Churn(kill, tuple(join), tuple(links), detect_s)


def _sides(sc: Scenario, me: str, other: str) -> list[str]:
    """How `other` is linked to `me` in `sc`, as add_neighbour sides."""
    a, b = sc.node(me), sc.node(other)
    s = sc.stages
    out = []
    if sc.cost(me, other) is not None:
        if a.is_data:
            if not b.is_data and b.stage == 0:
                out.append("next")
            if not b.is_data and b.stage == s - 1:
                out.append("prev")
        elif b.is_data:
            if a.stage == s - 1:
                out.append("next")
            if a.stage == 0:
                out.append("prev")
        elif b.stage == a.stage + 1:
            out.append("next")
        elif b.stage == a.stage - 1:
            out.append("prev")
    if not a.is_data and not b.is_data and a.stage == b.stage:
        out.append("peer")
    return out


def _uncut(nid: str, effects: list, cut: set[str]) -> list:
    """`effects` without the messages that cross a partition."""
    return [e for e in effects if not (isinstance(e, Send) and (nid in cut) != (e.to in cut))]


class _Cuttable:
    """A machine whose messages across a partition are lost, both the ones it sends and the ones it receives."""

    def __init__(self, nid: str, inner, cut: set[str]) -> None:
        self.nid, self.inner, self.cut = nid, inner, cut

    def start(self, now: float) -> list:
        return _uncut(self.nid, self.inner.start(now), self.cut)

    def on_message(self, now: float, sender: str, msg) -> list:
        if (sender in self.cut) != (self.nid in self.cut):
            return []
        return _uncut(self.nid, self.inner.on_message(now, sender, msg), self.cut)

    def on_timer(self, now: float, key: str) -> list:
        return _uncut(self.nid, self.inner.on_timer(now, key), self.cut)


class FlowRun:
    """The flow machines of a scenario in one simulator, with membership changes applied on the fly."""

    def __init__(self, scenario: Scenario, seed: int = 0, base: FlowConfig | None = None,
                 trace: TextIO | None = None, neighbours: int | None = None, formation: str = "auto") -> None:
        """`formation` and `neighbours` as flowsim.run_gwtf's (default: auto's choice); with scaled formation a
        relay that crashes or joins before every node has its flows calls formation off (protocol/flow/scaled.py)."""
        self.physical = scenario  # every link; `scenario` holds the flow links (neighbourhood.py)
        formation, neighbours = auto_choice(scenario, formation, neighbours)  # (the daemon's defaults: auto)
        self.k = neighbours
        scenario = bound_links(scenario, neighbours)
        self.scenario = scenario
        self.trace = trace  # receives every delivered message (flowsim.TracedMachine)
        self.seed = seed
        self.base = base
        self.known = [scenario]  # every scenario seen: link delays of joiners
        self.sim = Simulator(self._delay)
        cfgs = flow_configs(scenario, base)
        self.round_s = next(iter(cfgs.values())).round_s
        self.nodes = {nid: FlowNode(cfgs[nid], random.Random(f"{seed}:{nid}")) for nid in sorted(cfgs)}
        self.hosts = scaled_nodes(scenario, cfgs, self.nodes) if formation == "scaling" else {}
        for nid in sorted(cfgs):
            self.sim.add(nid, self._traced(nid, self.hosts.get(nid, self.nodes[nid])))
        self.sim.start_all()
        self.settle_from = 0.0
        self.cut: set[str] = set()  # nodes partitioned from the others (`partition`)

    def _traced(self, nid: str, m: FlowNode):
        return m if self.trace is None else TracedMachine(nid, m, self.trace)

    def _delay(self, a: str, b: str) -> float | None:
        for sc in reversed(self.known):
            if sc.has(a) and sc.has(b):
                v = sc.delay_ms(a, b)
                if v is not None:
                    return v * MS
        return None

    def member(self, nid: str):
        """The machine that takes `nid`'s membership calls: its scaled formation's host, or its flow machine."""
        return self.hosts.get(nid) or self.nodes[nid]

    def formed(self) -> float | None:
        """With scaled formation, the time the last node got its flows (None before); 0 without."""
        hosts = [h for nid, h in self.hosts.items() if nid in self.nodes]
        return None if any(h.handed is None for h in hosts) else max((h.handed for h in hosts), default=0.0)

    def last_change(self) -> float:
        return max([m.stats.last_change for m in self.nodes.values()] + [self.formed() or 0.0])

    def run_quiet(self, rounds: float, quiet_rounds: int = QUIET_ROUNDS_DEFAULT) -> None:
        """Run until no flow changed for `quiet_rounds` rounds (after `settle_from`), at most `rounds` more (with
        scaled formation: until every node has its flows, then at most `rounds` more)."""
        start = self.sim.now

        def quiet(now: float) -> bool:
            if self.hosts:
                formed = self.formed()
                if formed is None or now >= max(formed, start) + rounds * self.round_s:
                    return formed is not None
            if now - max(self.last_change(), self.settle_from) < quiet_rounds * self.round_s:
                return False
            return all(not m.pending and not m.token_pending for m in self.nodes.values())
        end = math.inf if self.hosts else self.sim.now + rounds * self.round_s
        self.sim.run_until(end, stop=quiet, check_every_s=self.round_s)

    def _call(self, nid: str, effects: list) -> None:
        if self.cut:
            effects = _uncut(nid, effects, self.cut)
        self.sim._apply(nid, effects)  # effects of a call made from outside an event handler

    def _bounded(self, churn: Churn) -> tuple[Churn, list[tuple[str, str, LinkSpec]]]:
        """`churn` with the joiners' links cut to those the daemon keeps (each joiner's cheapest on each side, and
        those whose previous-stage end takes it: `takes_newcomer`), and the links survivors add in place of
        next-stage relays killed (`refill`)."""
        if self.k <= 0:
            return churn, []
        phys = changed_scenario(self.physical, churn)
        flow = changed_scenario(self.scenario, replace(churn, join=(), join_links=()))
        joined = {n.id for n in churn.join}
        chosen: set[tuple[str, str]] = set()  # (upstream, downstream)
        for n in churn.join:
            prv = adjacent_relays(phys, n.id, -1)
            kept = {a: adjacent_relays(flow, a, 1) for a in prv if a not in joined}
            chosen |= joiner_links(n.id, adjacent_relays(phys, n.id, 1), prv, kept, self.k)
        relay = lambda x: not phys.node(x).is_data  # noqa: E731
        links = tuple(l for l in churn.join_links if not (relay(l.a) and relay(l.b))
                      or phys.node(l.a).stage == phys.node(l.b).stage or (l.a, l.b) in chosen or (l.b, l.a) in chosen)
        refills = []
        for r in sorted(x.id for x in flow.relays):
            lost = set(adjacent_relays(self.scenario, r, 1)) & set(churn.kill)
            if lost:
                kept = adjacent_relays(flow, r, 1)
                cands = {p: c for p, c in adjacent_relays(phys, r, 1).items() if p not in joined}
                refills += [(r, p, phys.neighbours(r)[p]) for p in sorted(refill(kept, cands, self.k))]
        self.physical = phys
        return replace(churn, join_links=links + tuple(link for _r, _p, link in refills)), refills

    def apply(self, churn: Churn) -> Scenario:
        """Crash / start the nodes now; schedule the neighbours' add/remove `detect_s` later (run to it)."""
        churn, refills = self._bounded(churn)
        new = changed_scenario(self.scenario, churn)
        old = self.scenario
        self.known.append(new)
        t0 = self.sim.now
        for nid in churn.kill:
            self.sim.kill(nid)
        for n in churn.join:
            cfg = flow_configs(new, self.base)[n.id]
            m = FlowNode(replace(cfg, joined=True), random.Random(f"{self.seed}:{n.id}"))
            self.nodes[n.id] = m
            self.sim.add(n.id, self._traced(n.id, m))
            self._call(n.id, m.start(t0))
        self.sim.run_until(t0 + churn.detect_s)
        now = self.sim.now = t0 + churn.detect_s
        joined = {n.id for n in churn.join}
        for nid in sorted(self.nodes):
            if nid in churn.kill:
                continue
            m, member = self.nodes[nid], self.member(nid)
            for dead in churn.kill:
                if old.cost(nid, dead) is not None or dead in m.cfg.peers:
                    self._call(nid, member.remove_neighbour(now, dead))
            if nid in joined:
                continue
            for j in sorted(joined):
                for side in _sides(new, nid, j):
                    cost = new.cost(nid, j) if side != "peer" else 0.0
                    self._call(nid, member.add_neighbour(now, j, cost, side))
        for r, p, link in refills:  # a survivor's link in place of a next-stage relay killed
            self._call(r, self.member(r).add_neighbour(now, p, link.cost, "next"))
            self._call(p, self.member(p).add_neighbour(now, r, link.cost, "prev"))
        for nid in churn.kill:
            self.nodes.pop(nid)
        self.scenario = new
        self.settle_from = now
        return new

    def _linked(self, nid: str) -> list[str]:
        return [o for o in sorted(self.nodes) if o != nid and _sides(self.scenario, o, nid)]

    def partition(self, nid: str, detect_s: float = 6.0) -> None:
        """Cut `nid` off (the daemon's partition: tests/lab/test_partition_lab.py): every message between it and the
        others is lost from now on, also those in flight; `detect_s` later (the liveness check) it and every
        node linked to it remove each other.  It keeps running on its own."""
        self.cut.add(nid)
        for k, mach in list(self.sim.machines.items()):
            if not isinstance(mach, _Cuttable):
                self.sim.machines[k] = _Cuttable(k, mach, self.cut)
        t0 = self.sim.now
        self.sim.run_until(t0 + detect_s)
        now = self.sim.now = t0 + detect_s
        for other in self._linked(nid):
            self._call(other, self.nodes[other].remove_neighbour(now, nid))
            self._call(nid, self.nodes[nid].remove_neighbour(now, other))

    def heal(self, nid: str, add_after_s: dict[str, float] | None = None, default_s: float = 0.3) -> None:
        """End `nid`'s partition.  Each side hears the other's Hello at once (`FlowNode.peer_back`) and adds the
        links after measuring them: node `x` adds its links to / from `nid` `add_after_s[x]` later (`nid` itself
        under its own name), `default_s` for the nodes not named (the daemon's link measurement: 5 s seen when a
        round trip timed out)."""
        self.cut.discard(nid)
        now = self.sim.now
        after = add_after_s or {}
        adds = []
        for other in self._linked(nid):
            self.nodes[other].peer_back(now, nid)
            self.nodes[nid].peer_back(now, other)
            for a, b in ((other, nid), (nid, other)):
                for side in _sides(self.scenario, a, b):
                    adds.append((after.get(a, default_s), a, b, side))
        for dt, a, b, side in sorted(adds):
            self.sim.run_until(now + dt)
            t = self.sim.now = max(self.sim.now, now + dt)
            cost = self.scenario.cost(a, b) if side != "peer" else 0.0
            self._call(a, self.nodes[a].add_neighbour(t, b, cost, side))
        self.settle_from = now

    def routing(self) -> RoutingResult:
        """The routing on the flow links now, with the rounds and messages since the start."""
        r = self.round_s
        return self.result(self.scenario, int(math.ceil(self.sim.now / r)), int(math.ceil(self.last_change() / r)),
                           self.sim.stats.messages)

    def result(self, scenario: Scenario, rounds: int, converged: int, messages: int) -> RoutingResult:
        flows, mismatched = extract_flows(scenario, self.nodes)
        extra = {"inconsistent_links": mismatched,
                 "messages_by_type": dict(sorted(self.sim.stats.messages_by_type.items()))}
        return RoutingResult(scenario.name, "gwtf", self.seed, flows, rounds=rounds, converged_round=converged,
                             messages=messages, extra=extra)


def run_churn(scenario: Scenario, churn: Churn, seed: int = 0, rounds: int = 120,
              base: FlowConfig | None = None, quiet_rounds: int = QUIET_ROUNDS_DEFAULT,
              trace: TextIO | None = None, neighbours: int | None = None, formation: str = "auto") -> ChurnResult:
    """Converge, apply `churn`, converge again (each phase at most `rounds` rounds); `trace` receives every
    delivered message; `formation` as `FlowRun`'s.  The routing before is on the flow links of `scenario` (`bound_links`), the one after on
    `changed`: the flow links after the churn (`FlowRun._bounded`)."""
    run = FlowRun(scenario, seed, base, trace, neighbours, formation)
    scenario = run.scenario
    run.run_quiet(rounds, quiet_rounds)
    r = run.round_s
    before = run.result(scenario, int(math.ceil(run.sim.now / r)), int(math.ceil(run.last_change() / r)),
                        run.sim.stats.messages)
    t0, msgs0 = run.sim.now, run.sim.stats.messages
    changed = run.apply(churn)
    run.run_quiet(rounds, quiet_rounds)
    last = max(run.last_change(), t0)
    after = run.result(changed, int(math.ceil((run.sim.now - t0) / r)), int(math.ceil((last - t0) / r)),
                       run.sim.stats.messages - msgs0)
    return ChurnResult(before, after, changed, t0, (last - t0) / r, run.sim.stats.messages - msgs0,
                       {"stuck": any(m.pending or m.token_pending for m in run.nodes.values())})


def held_back(scenario: Scenario, late) -> Scenario:
    """`scenario` without the relays `late` and their links (they join later: `run_trickle`)."""
    gone = set(late)
    return Scenario(scenario.name, scenario.stages, tuple(n for n in scenario.nodes if n.id not in gone),
                    tuple(l for l in scenario.links if l.a not in gone and l.b not in gone), scenario.activation_mb)


def run_trickle(scenario: Scenario, late, start_s: float = 2.0, every_s: float = 2.0, seed: int = 0,
                rounds: int = 120, base: FlowConfig | None = None, detect_s: float = 0.5,
                quiet_rounds: int = QUIET_ROUNDS_DEFAULT, neighbours: int | None = None,
                formation: str = "auto") -> RoutingResult:
    """Relays that join while the flows form (a swarm whose volunteers come one by one): the machines of
    `scenario` without the relays `late` start at 0; relay k of `late` joins at `start_s` + k x `every_s`, its
    neighbours (those present) told `detect_s` later; then the machines run until the flows are quiet (at most
    `rounds` rounds after the last join).  The routing is on the flow links at the end (everyone there, each
    relay's links as the daemon's: `FlowRun._bounded`), with the rounds from the start and the messages of the
    whole run."""
    return trickle(scenario, late, start_s, every_s, seed, rounds, base, detect_s, quiet_rounds,
                   neighbours, formation).routing()


def trickle(scenario: Scenario, late, start_s: float = 2.0, every_s: float = 2.0, seed: int = 0,
            rounds: int = 120, base: FlowConfig | None = None, detect_s: float = 0.5,
            quiet_rounds: int = QUIET_ROUNDS_DEFAULT, neighbours: int | None = None,
            formation: str = "auto") -> FlowRun:
    """`run_trickle`'s run, once the flows are quiet: its `scenario` holds the flow links at the end."""
    run = FlowRun(held_back(scenario, late), seed, base, neighbours=neighbours, formation=formation)
    present = {n.id for n in run.scenario.nodes}
    for k, nid in enumerate(late):
        run.sim.run_until(start_s + k * every_s)
        links = tuple(l for l in scenario.links if nid in (l.a, l.b) and (l.b if l.a == nid else l.a) in present)
        run.apply(Churn((), (scenario.node(nid),), links, detect_s))
        present.add(nid)
    run.run_quiet(rounds, quiet_rounds)
    return run
