"""`gwtf-node sim flow --policy gwtf`: one flow machine per node in the simulator.

Each node gets only what discovery would give it: its own links (costs to
the previous and next stage), the ids of its same-stage relays and of the
run's data nodes.  Its RNG is `random.Random(f"{seed}:{node_id}")`, so a run
is reproducible from the seed alone.

A *round* is one period of every node's tick (`round_s` of virtual time;
nodes tick with a random phase).  Message delays are the links' one-way
delays.  The run ends after `rounds` rounds, or earlier once no flow has
changed for `quiet_rounds` rounds; `converged_round` is the round of the last
change of any flow.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from typing import Any, TextIO

from ..protocol.flow import FlowConfig, FlowNode
from ..protocol.flow.scaled import ScaledNode
from ..protocol.flow.scaling import EAGER_PHASES, machine_for, quantized
from ..protocol.neighbourhood import FORMATIONS, auto_choice, bound_links
from ..protocol.scalemsgs import SCALE_MESSAGES
from ..protocol.scenario import Scenario
from .engine import Simulator
from .result import Flow, RoutingResult, path_cost

QUIET_ROUNDS_DEFAULT = 15  # no flow changed for this long: converged, stop early
MS = 1e-3


def link_delays(scenario: Scenario):
    """The simulator's delay function over `scenario`'s links: a link's one-way delay in seconds, None where
    there is no link (the simulator's fallback delay)."""
    def delay_s(a: str, b: str) -> float | None:
        v = scenario.delay_ms(a, b)
        return None if v is None else v * MS
    return delay_s


class TracedMachine:
    """A flow machine that writes every message delivered to it, in delivery order, to `out` (one line:
    time, sender, receiver, repr of the message) before handling it; used by `sim flow --trace` and by
    scripts/golden_flow.py to prove that a refactoring did not change a single message."""

    def __init__(self, node_id: str, machine: FlowNode, out: TextIO) -> None:
        self.node_id, self.machine, self.out = node_id, machine, out

    def start(self, now: float) -> list:
        return self.machine.start(now)

    def on_timer(self, now: float, key: str) -> list:
        return self.machine.on_timer(now, key)

    def on_message(self, now: float, sender: str, msg: Any) -> list:
        self.out.write(f"{now!r} {sender} {self.node_id} {msg!r}\n")
        return self.machine.on_message(now, sender, msg)


def flow_configs(scenario: Scenario, base: FlowConfig | None = None) -> dict[str, FlowConfig]:
    """What each node knows at start: its links, its stage peers, the data nodes."""
    s = scenario.stages
    commodities = tuple(sorted(n.id for n in scenario.data_nodes))
    cfgs: dict[str, FlowConfig] = {}
    for n in scenario.nodes:
        nxt: dict[str, float] = {}
        prv: dict[str, float] = {}
        for peer, link in scenario.neighbours(n.id).items():
            o = scenario.node(peer)
            if n.is_data:
                if not o.is_data and o.stage == 0:
                    nxt[peer] = link.cost
                if not o.is_data and o.stage == s - 1:
                    prv[peer] = link.cost
                continue
            if o.is_data:
                if n.stage == s - 1:
                    nxt[peer] = link.cost
                if n.stage == 0:
                    prv[peer] = link.cost
            elif o.stage == n.stage + 1:
                nxt[peer] = link.cost
            elif o.stage == n.stage - 1:
                prv[peer] = link.cost
        peers = () if n.is_data else tuple(sorted(r.id for r in scenario.relays_of_stage(n.stage) if r.id != n.id))
        cfg = FlowConfig(n.id, n.is_data, n.capacity, commodities, nxt, prv, peers)
        if base is not None:
            cfg = replace(base, node_id=n.id, is_data=n.is_data, capacity=n.capacity, commodities=commodities,
                          next_costs=nxt, prev_costs=prv, peers=peers)
        cfgs[n.id] = cfg
    return cfgs


def extract_flows(scenario: Scenario, nodes: dict[str, FlowNode]) -> tuple[list[Flow], int]:
    """Decompose the nodes' link counts into unit paths from each data node back to it; also count links whose two
    ends disagree.  A unit still on its way (a node holding more units than it sends on) leaves a chain that ends
    early: the search backs out of it and goes on, so the complete paths behind it are all counted."""
    mismatched = 0
    for nid, m in nodes.items():
        for d, outs in m.out.items():
            for j, n in outs.items():
                if nodes[j].inn[d].get(nid, 0) != n:
                    mismatched += 1
    remaining = {nid: {d: dict(o) for d, o in m.out.items()} for nid, m in nodes.items()}
    flows: list[Flow] = []
    for d in sorted(n.id for n in scenario.data_nodes):
        dead: set[tuple[str, int]] = set()  # (node, hops taken): no complete path on from there; links only go away
        while (path := _unit_path(nodes, remaining, d, scenario.stages, dead)) is not None:
            for a, b in zip((d, *path), (*path, d)):
                remaining[a][d][b] -= 1
            flows.append(Flow(d, tuple(path), path_cost(scenario, d, tuple(path))))
    return flows, mismatched


def _unit_path(nodes: dict[str, FlowNode], remaining: dict[str, dict[str, dict[str, int]]], d: str, stages: int,
               dead: set[tuple[str, int]]) -> list[str] | None:
    """A path d -> one relay per stage -> d over the links with units left (depth first, peers in name order)."""

    def dfs(cur: str, depth: int) -> list[str] | None:
        outs = remaining[cur][d]
        if depth == stages:
            return [] if outs.get(d, 0) > 0 else None
        for j in sorted(outs):
            if outs[j] > 0 and not nodes[j].cfg.is_data and (j, depth + 1) not in dead:
                rest = dfs(j, depth + 1)
                if rest is not None:
                    return [j, *rest]
                dead.add((j, depth + 1))
        return None

    return dfs(d, 0)


def add_flow_choice(ap) -> None:
    """The benchmarks' `--neighbours K` and `--formation` (`run_gwtf`'s `neighbours` and `formation`) on the
    argparse parser `ap`, auto by default as the daemon's."""
    ap.add_argument("--neighbours", type=int, default=None, metavar="K",
                    help="bound each relay's flow links to K, 0: every link (the daemon's --flow-neighbours K: "
                         "protocol/neighbourhood.py; default auto, the daemon's)")
    ap.add_argument("--formation", choices=FORMATIONS, default="auto",
                    help="form the flows by label waves or by cost scaling first (flow/scaling.py); default auto, "
                         "the daemon's (neighbourhood.py `auto_choice`)")


def scaled_nodes(scenario: Scenario, cfgs: dict[str, FlowConfig], nodes: dict[str, FlowNode],
                 factor: int = 2, eager_phases: int = EAGER_PHASES) -> dict[str, ScaledNode]:
    """Each node's flow machine behind scaled formation (protocol/flow/scaling.py `machine_for`, as the daemon
    builds it), one data node, which knows every other node.  Integer link costs are taken as they are, others in
    whole `COST_QUANTUM_MS` (`quantized`, as the daemon's)."""
    (data,) = [n.id for n in scenario.data_nodes]
    peers = tuple(sorted(set(cfgs) - {data}))
    caps = {n.id: n.capacity for n in scenario.nodes}
    whole = all(float(link.cost).is_integer() for link in scenario.links)
    hosts = {}
    for nid, cfg in cfgs.items():
        cfg = cfg if whole else quantized(cfg)
        near = {p: caps[p] for p in (*cfg.next_costs, *cfg.prev_costs)}
        hosts[nid] = ScaledNode(nodes[nid], machine_for(cfg, near, peers, scenario.stages, factor, eager_phases))
    return hosts


def run_gwtf(scenario: Scenario, seed: int = 0, rounds: int = 120, base: FlowConfig | None = None,
             quiet_rounds: int = QUIET_ROUNDS_DEFAULT, wall_limit_s: float | None = None,
             trace: TextIO | None = None, neighbours: int | None = None, formation: str = "auto",
             scale_loss: float = 0.0, eager_phases: int = EAGER_PHASES) -> RoutingResult:
    """Run the flow machines; `wall_limit_s` (benchmarks only) stops early, marking `extra["wall_limited"]`;
    `trace` receives every delivered message (`TracedMachine`).  `neighbours` K > 0 bounds each relay's links as
    the daemon's `--flow-neighbours K` (protocol/neighbourhood.py), 0 keeps every link of the scenario.
    `formation` "scaling" forms the flows by cost scaling first (`scaled_nodes`; one data node, integer link
    costs), "waves" with label waves alone; the defaults, as the daemon's, are auto's choice (neighbourhood.py
    `auto_choice`).  With scaled formation the run goes on until every node has its flows and then for at most
    `rounds` rounds, and `extra["formed_s"]` is the time the last node got them.  `scale_loss` loses that fraction of formation's messages (seeded; the daemon's links
    lose one in a libp2p connection reset), which formation sends again (flow/resend.py); `eager_phases`: the
    phases whose relabels are told (the daemon's `EAGER_PHASES`, flow/scaling.py)."""
    formation, neighbours = auto_choice(scenario, formation, neighbours)
    scenario = bound_links(scenario, neighbours)
    cfgs = flow_configs(scenario, base)
    round_s = next(iter(cfgs.values())).round_s
    drop = random.Random(f"{seed}:loss")
    sim = Simulator(link_delays(scenario), lose=(lambda _a, _b, msg: isinstance(msg, SCALE_MESSAGES)
                                                 and drop.random() < scale_loss) if scale_loss else None)
    nodes = {nid: FlowNode(cfgs[nid], random.Random(f"{seed}:{nid}")) for nid in sorted(cfgs)}
    hosts = scaled_nodes(scenario, cfgs, nodes, eager_phases=eager_phases) if formation == "scaling" else {}
    for nid in sorted(cfgs):
        m = hosts.get(nid, nodes[nid])
        sim.add(nid, m if trace is None else TracedMachine(nid, m, trace))
    sim.start_all()

    def formed() -> float | None:
        return None if any(h.handed is None for h in hosts.values()) else max((h.handed for h in hosts.values()),
                                                                            default=0.0)

    def last_change() -> float:
        return max([m.stats.last_change for m in nodes.values()] + [formed() or 0.0])

    t_wall = time.perf_counter()
    limited = []

    def quiet(now: float) -> bool:
        if wall_limit_s is not None and time.perf_counter() - t_wall > wall_limit_s:
            limited.append(now)
            return True
        done = formed() if hosts else None
        if hosts and (done is None or now >= done + rounds * round_s):
            return done is not None
        if now - last_change() < quiet_rounds * round_s:
            return False
        return all(not m.pending and not m.token_pending for m in nodes.values())

    sim.run_until(math.inf if hosts else rounds * round_s, stop=quiet, check_every_s=round_s)
    flows, mismatched = extract_flows(scenario, nodes)
    done = int(math.ceil(sim.now / round_s)) if hosts else min(rounds, int(math.ceil(sim.now / round_s)))
    converged = int(math.ceil(last_change() / round_s))
    extra = {"inconsistent_links": mismatched,
             "wall_limited": bool(limited),
             "moves": sum(m.stats.moves_done for m in nodes.values()),
             "waves": sum(m.epoch[nid] for nid, m in nodes.items() if m.cfg.is_data and m.waves),
             "messages_by_type": dict(sorted(sim.stats.messages_by_type.items()))}
    if hosts:
        extra.update(formation="scaling", formed_s=formed(), scaling_phases=hosts[scenario.data_nodes[0].id].scaling.phase,
                     held_dropped=sum(h.dropped for h in hosts.values()), scaled_over=sorted(
                         {h.formation.over for h in hosts.values()}), lost=sim.stats.lost,
                     resent=sum(h.formation.resend.resent for h in hosts.values()),
                     duplicates=sum(h.formation.resend.duplicates for h in hosts.values()))
    recalls = sum(m.stats.recalls for m in nodes.values())
    if recalls:
        extra["recalls"] = recalls  # recall waves (flow/launches.py), reported where there were any
    return RoutingResult(scenario.name, "gwtf", seed, flows, rounds=done, converged_round=converged,
                         messages=sim.stats.messages, extra=extra)
