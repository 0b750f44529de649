"""Pooled formation in the daemon: the machines of `protocol/flow/pool.py` this node hosts, their frames, and when
the node hands over to its per-data-node flow machine.

With `--pooled-formation` and several data nodes, a node that forms its flows
at the start of a run (not one the leader placed later) runs pooled formation
first: the machines `protocol/flow/poolnodes.py` gives it (a relay one, a data
node its source and sink sides, the first data node by peer id the pool as
well; ids `<peer>/src`, `<peer>/snk`, `<peer>/pool`).  Their messages travel as
`PoolFrame`s (the receiving role, the sending role, the encoded flow or homing
message), read here with the codec and the value bounds like any frame, sent
through an `Outbox` (driver.py: in order per peer, the flow machines assume
FIFO links); a message between two machines of this node goes to the other at once.  Only the pool
sends `HomingStart`, `CostQuery` and `Install`; a flow message comes from a
peer the receiving machine links to.

`Flows.form` gives the pooled machines the links it measured (`pooled_machines`).

The node hands over once each of its machines holds what homing installed
(`Install`), or when it holds no pooled units and a flow message of a
per-data-node machine arrives (a neighbour handed over already: `Flows`), or
`GIVE_UP_S` after the start with what it has (nothing where homing did not
reach it): `installed` are the units its per-data-node machine adopts.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ...protocol import bounds, codec
from ...protocol import messages as m
from ...protocol.driver import UnknownEffect, carry_out
from ...protocol.flow.homing import unit_cost
from ...protocol.flow.pool import PoolMachine
from ...protocol.flow.poolnodes import (
    GIVE_UP_S, ROLES, Counts, add_peer, drop_peer, holds_units, installed, role_id, split_id,
)
from ..net.wire import FrameRefused, Wire, now
from .driver import Drivers, Outbox, Owner

log = logging.getLogger("gwtf.node")

HOMING_MSGS = (m.HomingStart, m.TraceUnit, m.CostQuery, m.CostReply, m.Install)
FROM_POOL = (m.HomingStart, m.CostQuery, m.Install)
GIVE_UP = "give up"  # its timer key


class _RoleOut:
    """The `protocol.driver.Driver` of one pooled machine: its sends become `PoolFrame`s (or go to a machine of
    this node), its timers are keyed by its role."""

    def __init__(self, pooling: Pooling, role: str) -> None:
        self.pooling, self.role = pooling, role

    def send(self, to: str, msg: Any) -> None:
        self.pooling.route(self.role, to, msg)

    def set_timer(self, key: Any, deadline: float) -> None:
        self.pooling.timers.set_timer((self.role, key), deadline)

    def cancel_timer(self, key: Any) -> None:
        self.pooling.timers.cancel_timer((self.role, key))

    def compute(self, e: Any) -> None:
        raise UnknownEffect(f"a pooled flow machine returned {e!r}: it has no worker")

    def flush(self) -> None:
        pass  # (`Pooling.carry` starts the sending once its machines are done)


class Pooling:
    """This node's pooled machines, driven (module doc); `on_done` is called once the node hands over."""

    def __init__(self, wire: Wire, drivers: Drivers, machines: dict[str, PoolMachine],
                 on_done: Callable[[], None], data: tuple[str, ...]) -> None:
        self.wire, self.machines, self.on_done = wire, machines, on_done
        self.data = set(data)  # the run's data nodes (their sides are the pooled machines' links to them)
        self.me = wire.me
        self.timers = drivers.make(Owner.POOLING, self._on_timer)
        self.pool_id = next(iter(machines.values())).commodity
        self.outbox = Outbox(wire, wire.send_in_order)  # PoolFrames to each peer, in order (FIFO links)
        self.local: list[tuple[str, str, Any]] = []  # (role, sender id, message) for a machine of this node
        self.done = False

    def start(self) -> None:
        log.info("pooled formation: %s (pool %s)", ", ".join(role_id("this node", r) for r in sorted(self.machines)),
                 self.pool_id[:16])
        for role in sorted(self.machines):
            self.carry(role, self.machines[role].start(now()))
        self.timers.set_timer(GIVE_UP, now() + GIVE_UP_S)

    # ------------------------------------------------------------------ reading
    @property
    def homed(self) -> bool:
        return all(pm.homed for pm in self.machines.values())

    def holds_units(self) -> bool:
        return holds_units(self.machines)

    def linked(self, peer: str) -> bool:
        """Whether a pooled machine of this node links to `peer` (or to one of its sides) on any side."""
        return any(split_id(n)[0] == peer for pm in self.machines.values()
                   for n in (*pm.cfg.next_costs, *pm.cfg.prev_costs, *pm.cfg.peers))

    def installed(self) -> tuple[Counts, Counts]:
        return installed(self.machines)

    # ------------------------------------------------------------------ driving
    def carry(self, role: str, effects: list) -> None:
        """Carry out a machine's effects, then what they start at this node's other machines; send; hand over
        once done."""
        carry_out(_RoleOut(self, role), effects, what=f"the pooled {role or 'relay'} machine")
        while self.local:
            to, sender, msg = self.local.pop(0)
            carry_out(_RoleOut(self, to), self.machines[to].on_message(now(), sender, msg),
                      what=f"the pooled {to or 'relay'} machine")
        self.outbox.start()
        if self.homed:
            self.hand_over("homing installed its units")

    def route(self, role: str, to: str, msg: Any) -> None:
        peer, to_role = split_id(to)
        if peer == self.me:
            if to_role in self.machines:
                self.local.append((to_role, role_id(self.me, role), msg))
            return
        self.outbox.put(peer, [m.PoolFrame(to_role, role, codec.encode("", msg))])

    def hand_over(self, why: str) -> None:
        if self.done:
            return
        self.done = True
        self.timers.cancel_timer(GIVE_UP)  # (the machines' timers still due find it done)
        log.info("pooled formation over (%s): %d units installed here", why,
                 sum(n for v in self.installed()[1].values() for n in v.values()))
        pool = self.machines.get("pool")
        if pool is not None and pool.homed:
            st = pool.stats
            cost = lambda u: unit_cost(lambda a, b: pool.costs.get((a, b)), u)  # noqa: E731
            log.info("homing: %d units traced (%d ended at another data node, %d held on their way and left out), "
                     "their links cost %.1f pooled and %.1f homed (%s)", st.traced,
                     sum(u[0] != u[2] for u in st.pooled), st.held, sum(cost(u) for u in st.pooled),
                     sum(cost(u) for u in st.homed), st.steps)
        self.on_done()

    def _on_timer(self, key: Any) -> None:
        if self.done:
            return
        if key == GIVE_UP:
            log.warning("pooled formation: not handed over %g s after it began: handing over with what homing "
                        "installed here", GIVE_UP_S)
            self.hand_over("gave up")
            return
        role, k = key
        if role in self.machines:
            self.carry(role, self.machines[role].on_timer(now(), k))

    # ------------------------------------------------------------------ events
    def on_frame(self, peer: str, f: m.PoolFrame, flow_msgs: tuple[type, ...]) -> None:
        """A `PoolFrame`: checked (module doc), then to the machine of its role."""
        pm = self.machines.get(f.role)
        if pm is None:
            raise FrameRefused(f"PoolFrame for role {f.role!r}: this node hosts "
                               f"{', '.join(repr(r) for r in sorted(self.machines))}")
        if f.sender_role not in ROLES:
            raise FrameRefused(f"PoolFrame from role {f.sender_role!r}: the roles are {ROLES}")
        try:
            _, msg = codec.decode(f.frame)
        except codec.DecodeError as e:
            raise FrameRefused(f"PoolFrame holds no valid frame: {e}") from None
        if not isinstance(msg, HOMING_MSGS + flow_msgs):
            raise FrameRefused(f"a PoolFrame holds a flow or homing message, not a {type(msg).__name__}")
        problem = bounds.check(msg, bounds.Context())
        if problem is not None:
            raise FrameRefused(f"PoolFrame's {type(msg).__name__}: {problem}")
        sender = role_id(peer, f.sender_role)
        if isinstance(msg, FROM_POOL) and sender != self.pool_id:
            raise FrameRefused(f"{type(msg).__name__} from {sender[:24]}: only the pool sends it")
        if not self.done:  # (a flow message from no link yet: the machine keeps its labels, refuses its requests)
            self.carry(f.role, pm.on_message(now(), sender, msg))

    def on_link_cost(self, peer: str, msg: m.LinkCost) -> None:
        """The upstream end of a link says its cost: the pooled machine linked to it takes it (as `Flows`)."""
        for role, pm in sorted(self.machines.items()):
            for nid in (peer, role_id(peer, "src")):
                if not pm.homed and pm.cfg.prev_costs.get(nid, msg.cost) != msg.cost:
                    self.carry(role, pm.inner.on_message(now(), nid, msg))

    def add_neighbour(self, peer: str, cost: float, side: str) -> None:
        """A peer heard of after pooled formation began, measured: the machines it is a link of add it (a data
        node as its source side before stage 0, its sink side after the last stage), as `Flows` adds it to
        the flow machine."""
        for role, eff in add_peer(self.machines, now(), peer, cost, side, self.data):
            self.carry(role, eff)

    def peer_gone(self, peer: str) -> None:
        """A peer crashed or left: each pooled machine linked to it (or to one of its sides) drops the link."""
        for role, eff in drop_peer(self.machines, now(), peer):
            self.carry(role, eff)
