"""Which pooled machines (pool.py) each node of a swarm hosts, and their ids: what the daemon
(runtime/node/pooling.py) and the training simulator (sim/train/pooling.py) both build.

A relay hosts one pooled machine, a data node two (its source side and its
sink side), and the first data node by id the pool as well.  A machine's id is
its node's id with its role: `<node>/src`, `<node>/snk`, `<node>/pool`; a
relay's is its node's id.  A relay's link to a data node becomes its link to
that data node's source side (stage 0) or sink side (last stage); a data
node's links to the stage-0 relays are its source side's, to the last-stage
relays its sink side's; the pool links to every side at no cost.  Pure.
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
