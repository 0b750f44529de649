"""`gwtf-node sim flow --pooled`: several data nodes formed as one commodity, then homed (protocol/flow/pool.py).

`pooled_scenario` builds the network of pooled formation from a scenario:
each data node d becomes its source side `d/src` (stage 0, capacity its
demand) and its sink side `d/snk` (after the last stage), the relays move
one stage on, and a pool data node (`POOL_ID`) links to every side at no cost
(its delay to a side: none for the first data node, which hosts it, else the
median link delay of the scenario).  `run_pooled` runs one `FlowNode` per node
of that network, each wrapped in a `PoolMachine`, until the pool has
installed the homed routes (or `rounds` pass), and reads the units back from
what each node installed.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

from ..protocol.flow import FlowConfig, FlowNode
from ..protocol.flow.homing import unit_cost
from ..protocol.flow.pool import POOL, RELAY, SINK, SOURCE, PoolConfig, PoolMachine
from ..protocol.neighbourhood import FLOW_NEIGHBOURS, bound_links
from ..protocol.scenario import ROLE_DATA, LinkSpec, NodeSpec, Scenario
from .engine import Simulator
from .flowchurn import Churn, changed_scenario
from .flowsim import extract_flows, flow_configs, link_delays
from .result import Flow, RoutingResult, path_cost

POOL_ID = "pool"


def source_of(d: str) -> str:
    return d + "/src"


def sink_of(d: str) -> str:
    return d + "/snk"


def pooled_scenario(sc: Scenario) -> Scenario:
    """The network of pooled formation (module doc)."""
    s, data = sc.stages, sorted(n.id for n in sc.data_nodes)
    if s < 1 or not data:
        raise ValueError("pooled formation needs data nodes and at least one stage")
    delay = statistics.median(l.delay_ms[0] for l in sc.links) if sc.links else 0.0
    nodes = [NodeSpec(POOL_ID, ROLE_DATA, sum(sc.node(d).capacity for d in data))]
    links = []
    for d in data:
        cap, dl = sc.node(d).capacity, (0.0 if d == data[0] else delay)
        nodes += [NodeSpec(source_of(d), "relay", cap, 0), NodeSpec(sink_of(d), "relay", cap, s + 1)]
        links += [LinkSpec(POOL_ID, source_of(d), 0.0, (dl, dl)), LinkSpec(sink_of(d), POOL_ID, 0.0, (dl, dl))]
    nodes += [replace(n, stage=n.stage + 1) for n in sc.relays]
    for link in sc.links:
        a, b = sc.node(link.a), sc.node(link.b)
        if a.is_data == b.is_data:
            if not a.is_data:
                links.append(link)
            continue
        d, r = (a, b) if a.is_data else (b, a)
        for side, stage in ((source_of(d.id), 0), (sink_of(d.id), s - 1)):
            if r.stage == stage:
                links.append(replace(link, a=side, b=r.id) if a.is_data else replace(link, a=r.id, b=side))
    return Scenario(sc.name + "-pooled", s + 2, tuple(nodes), tuple(links), sc.activation_mb)


def pool_configs(sc: Scenario) -> dict[str, PoolConfig]:
    data = sorted(n.id for n in sc.data_nodes)
    cfgs = {n.id: PoolConfig(RELAY) for n in sc.relays}
    for d in data:
        cfgs[source_of(d)], cfgs[sink_of(d)] = PoolConfig(SOURCE, d), PoolConfig(SINK, d)
    cfgs[POOL_ID] = PoolConfig(POOL, data[0], {source_of(d): d for d in data}, {sink_of(d): d for d in data},
                               {d: sc.node(d).capacity for d in data})
    return cfgs


def installed_flows(sc: Scenario, machines: dict[str, PoolMachine]) -> tuple[list[Flow], int]:
    """The units of the installed routes, from each data node along the relays' installed counts; and the relays
    that still hold pooled units without routes (0 once homing reached every unit)."""
    out = {r.id: {d: dict(v) for d, v in machines[r.id].out.items()} for r in sc.relays if machines[r.id].homed}
    left = sum(1 for r in sc.relays if not machines[r.id].homed and any(machines[r.id].out.get(POOL_ID, {}).values()))
    flows = []
    for d in sorted(n.id for n in sc.data_nodes):
        firsts = sorted(r for r in out if sc.node(r).stage == 0)
        for r0 in firsts:
            for _ in range(machines[r0].inn.get(d, {}).get(d, 0)):
                path = _walk(sc, out, d, r0)
                if path is not None:
                    flows.append(Flow(d, tuple(path), path_cost(sc, d, tuple(path))))
    return flows, left


def _walk(sc: Scenario, out: dict, d: str, r0: str) -> list[str] | None:
    """One unit of `d` from `r0` along the installed counts to `d` (taking them), None where they end early."""
    path, cur = [r0], r0
    while sc.node(cur).stage < sc.stages - 1:
        nxt = next((p for p, n in sorted(out[cur].get(d, {}).items()) if n > 0 and p in out), None)
        if nxt is None:
            return None
        out[cur][d][nxt] -= 1
        path.append(nxt)
        cur = nxt
    if out[cur].get(d, {}).get(d, 0) <= 0:
        return None
    out[cur][d][d] -= 1
    return path


def handover(sc: Scenario, machines: dict[str, PoolMachine], seed: int = 0,
             base: FlowConfig | None = None) -> dict[str, FlowNode]:
    """The per-data-node flow machines of `sc` (as `run_gwtf` starts them), each holding the units homing
    installed at its node (`FlowNode.adopt`), not started: what runs on after pooled formation."""
    nodes = {}
    for nid, cfg in flow_configs(sc, base).items():
        node = FlowNode(cfg, random.Random(f"{seed}:{nid}"))
        if cfg.is_data:
            src, snk = machines[source_of(nid)], machines[sink_of(nid)]
            node.adopt(snk.inn if snk.homed else {}, src.out if src.homed else {})
        elif machines[nid].homed:
            node.adopt(machines[nid].inn, machines[nid].out)
        nodes[nid] = node
    return nodes


def _crash(sim: Simulator, sc: Scenario, net: Scenario, machines: dict[str, PoolMachine], kill: tuple[str, ...],
           detect_s: float) -> tuple[Scenario, Scenario]:
    """`kill` crash now; `detect_s` later every machine linked to one drops it (`FlowNode.remove_neighbour`); the
    scenario and the pooled network without them."""
    t0 = sim.now
    for nid in kill:
        sim.kill(nid)
    sim.run_until(t0 + detect_s)
    now = sim.now = t0 + detect_s
    for nid, pm in sorted(machines.items()):
        if nid in kill:
            continue
        for dead in kill:
            if dead in pm.cfg.next_costs or dead in pm.cfg.prev_costs or dead in pm.cfg.peers:
                sim._apply(nid, pm.inner.remove_neighbour(now, dead))  # (a call from outside an event handler)
    for nid in kill:
        machines.pop(nid)
    churn = Churn(kill=kill)
    return changed_scenario(sc, churn), changed_scenario(net, churn)


def run_pooled(scenario: Scenario, seed: int = 0, rounds: int = 120, base: FlowConfig | None = None,
               neighbours: int = FLOW_NEIGHBOURS, continue_rounds: int = 0, kill: tuple[str, ...] = (),
               kill_at_s: float = 0.0, detect_s: float = 2.0) -> RoutingResult:
    """Pooled formation and homing in the simulator (module doc); `extra` reports the pooled units' cost
    (`pooled_cost`, before homing), how many ended at another data node (`crossed`), homing's steps.  With
    `continue_rounds`, the per-data-node machines then run on from the homed units for that many rounds
    (`handover`), and the flows are theirs (`extra["continued_messages"]`).  `kill`: relays that crash at
    `kill_at_s` while the flows form (unless homing is over by then); every machine linked to one drops the link
    `detect_s` later, as the daemon's `Pooling.peer_gone` does; the flows are read over the scenario without
    them."""
    scenario = bound_links(scenario, neighbours)
    net = pooled_scenario(scenario)
    cfgs, pcfgs = flow_configs(net, base), pool_configs(scenario)
    round_s = cfgs[POOL_ID].round_s
    sim = Simulator(link_delays(net))
    machines: dict[str, PoolMachine] = {}
    for nid in sorted(cfgs):
        machines[nid] = PoolMachine(FlowNode(cfgs[nid], random.Random(f"{seed}:{nid}")), pcfgs[nid])
        sim.add(nid, machines[nid])
    sim.start_all()
    pool = machines[POOL_ID]
    if kill:
        sim.run_until(kill_at_s, stop=lambda now: pool.homed, check_every_s=round_s)
        scenario, net = _crash(sim, scenario, net, machines, kill, detect_s)
    sim.run_until(rounds * round_s, stop=lambda now: pool.homed, check_every_s=round_s)
    flows, unrouted = installed_flows(scenario, machines)
    st = pool.stats
    extra = {"formation": "pooled", "homed": pool.homed, "homed_at": st.homed_at, "homing_rounds": st.rounds,
             "traced": st.traced, "held": st.held, "unrouted_relays": unrouted, "inconsistent_links": unrouted,
             "pooled_cost": sum(unit_cost(scenario.cost, u) for u in st.pooled),
             "crossed": sum(u[0] != u[2] for u in st.pooled), **st.steps,
             "messages_by_type": dict(sorted(sim.stats.messages_by_type.items()))}
    messages = sim.stats.messages
    if continue_rounds > 0:
        nodes = handover(scenario, machines, seed, base)
        after = Simulator(link_delays(scenario))
        for nid in sorted(nodes):
            after.add(nid, nodes[nid])
        after.start_all()
        after.run_until(continue_rounds * round_s)
        flows, extra["inconsistent_links"] = extract_flows(scenario, nodes)
        extra["continued_messages"] = after.stats.messages
        messages += after.stats.messages
    converged = int(math.ceil((st.homed_at if st.homed_at is not None else sim.now) / round_s))
    return RoutingResult(scenario.name, "gwtf", seed, flows, rounds=min(rounds, converged),
                         converged_round=converged, messages=messages, extra=extra)

