"""Which pooled machines (pool.py) each node of a swarm hosts, and their ids: what the daemon
(runtime/node/pooling.py) and the training simulator (sim/train/pooling.py) both build.

A relay hosts one pooled machine, a data node two (its source side and its
sink side), and the first data node by id the pool as well.  A machine's id is
its node's id with its role: `<node>/src`, `<node>/snk`, `<node>/pool`; a
relay's is its node's id.  A relay's link to a data node becomes its link to
that data node's source side (stage 0) or sink side (last stage); a data
node's links to the stage-0 relays are its source side's, to the last-stage
relays its sink side's; the pool links to every side at no cost.  Also what both
do with a node's machines: add or drop a peer, and read what homing installed.  Pure.
"""

from __future__ import annotations

from typing import Any, Callable

from .config import FlowConfig
from .node import FlowNode
from .pool import POOL, RELAY, SINK, SOURCE, PoolConfig, PoolMachine

ROLES = ("", "src", "snk", "pool")  # a relay's machine, a data node's source side, its sink side, the pool
ROLE_SIDES = {"": ("next", "prev", "peer"), "src": ("next",), "snk": ("prev",), "pool": ()}  # links a peer makes
GIVE_UP_S = 300.0  # a node not handed over this long after pooled formation began hands over with what it has


def role_id(peer: str, role: str) -> str:
    return f"{peer}/{role}" if role else peer


def split_id(nid: str) -> tuple[str, str]:
    """(node id, role) of a pooled machine's id (a node id holds no "/")."""
    peer, _, role = nid.partition("/")
    return peer, role


def pooled_machines(me: str, relay: bool, capacity: int, data: list[str], demand: dict[str, int],
                    next_costs: dict[str, float], prev_costs: dict[str, float], stage_peers: tuple[str, ...],
                    rng: Callable[[str], Any]) -> dict[str, PoolMachine]:
    """This node's pooled machines by role, over the links it measured (module doc); `data`: the run's data nodes
    sorted (the pool is the first one's), `demand`: each one's units, `rng(id)`: a machine's random."""
    pool = role_id(data[0], "pool")

    def sides(costs: dict[str, float], role: str) -> dict[str, float]:
        return {role_id(p, role) if p in data else p: c for p, c in costs.items()}

    def machine(cfg: FlowConfig, pcfg: PoolConfig) -> PoolMachine:
        return PoolMachine(FlowNode(cfg, rng(cfg.node_id)), pcfg)

    if relay:
        cfg = FlowConfig(me, False, capacity, (pool,), sides(next_costs, "snk"), sides(prev_costs, "src"), stage_peers)
        return {"": machine(cfg, PoolConfig(RELAY))}
    others = tuple(d for d in data if d != me)
    out = {
        "src": machine(FlowConfig(role_id(me, "src"), False, demand[me], (pool,), dict(next_costs), {pool: 0.0},
                                  tuple(role_id(d, "src") for d in others)), PoolConfig(SOURCE, me)),
        "snk": machine(FlowConfig(role_id(me, "snk"), False, demand[me], (pool,), {pool: 0.0}, dict(prev_costs),
                                  tuple(role_id(d, "snk") for d in others)), PoolConfig(SINK, me)),
    }
    if me == data[0]:
        srcs, snks = {role_id(d, "src"): d for d in data}, {role_id(d, "snk"): d for d in data}
        cfg = FlowConfig(pool, True, sum(demand.values()), (pool,), dict.fromkeys(srcs, 0.0), dict.fromkeys(snks, 0.0))
        out["pool"] = machine(cfg, PoolConfig(POOL, me, srcs, snks, dict(demand)))
    return out


Machines = dict[str, PoolMachine]  # a node's pooled machines by role
Counts = dict[str, dict[str, dict[str, int]]]  # per data node, per peer: units (`FlowNode.inn` / `out`)


def holds_units(machines: Machines) -> bool:
    """Whether a machine of the node holds pooled units (homing will tell it where they go)."""
    return any(n for pm in machines.values() if not pm.homed
               for side in (pm.inner.inn, pm.inner.out) for v in side.values() for n in v.values())


def installed(machines: Machines) -> tuple[Counts, Counts]:
    """The per-data-node units homing installed at the node: (inn, out) as `FlowNode.adopt` takes them."""
    if "" in machines:
        pm = machines[""]
        return (pm.inn, pm.out) if pm.homed else ({}, {})
    src, snk = machines["src"], machines["snk"]
    return (snk.inn if snk.homed else {}), (src.out if src.homed else {})


def over_links(counts: Counts, costs: dict[str, float]) -> Counts:
    """The units of `counts` over the links in `costs` (those the node's flow machine still has)."""
    return {d: {p: n for p, n in v.items() if p in costs and n > 0} for d, v in counts.items()}


def add_peer(machines: Machines, now: float, peer: str, cost: float, side: str, data):
    """A peer heard of after pooled formation began: each machine it is a link of by `side` adds it (a data node
    as its source side before stage 0, its sink side after the last stage); yields (role, effects), each to be
    carried out before the next machine adds it."""
    for role, pm in sorted(machines.items()):
        if pm.homed or side not in ROLE_SIDES[role]:
            continue
        nid = role_id(peer, "src" if side == "prev" else "snk") if role == "" and peer in data else peer
        yield role, pm.inner.add_neighbour(now, nid, cost, side)


def drop_peer(machines: Machines, now: float, peer: str):
    """A peer crashed or left: each machine not homed drops its links to the peer's machines; yields (role,
    effects) as `add_peer`."""
    for role, pm in sorted(machines.items()):
        cfg = pm.cfg
        for nid in [n for n in (*cfg.next_costs, *cfg.prev_costs, *cfg.peers) if split_id(n)[0] == peer]:
            if not pm.homed:
                yield role, pm.inner.remove_neighbour(now, nid)
