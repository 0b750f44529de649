"""Pooled formation in the training simulator (`TrainSimOptions.pooled_formation`; the daemon's
`join --pooled-formation`, runtime/node/pooling.py).

With the option and several data nodes, every node at the run's start builds
the pooled machines `protocol/flow/poolnodes.py` gives it over the links its
flow machine would have (`FlowDriver._flow_config`), and they form and home
the flows (protocol/flow/pool.py).  Their messages take the latency of the
link between the two hosts (none within a node) and count as flow messages.
A node hands over as the daemon's does: once each of its machines holds what
homing installed, or when it holds no pooled units and a per-data-node flow
message reaches it (a neighbour handed over already; with pooled units the
message waits for the hand-over), or `GIVE_UP_S` after the start.  Its flow
machine then starts holding the units homing installed over links it still
has (`FlowNode.adopt`) and runs on as any other; a data node opens iteration
0 once its flows are formed (`FlowDriver._sync_flows`).  A crash reported
while the flows are pooled drops the links of every pooled machine to the
crashed node's machines; a joiner forms per data node, and the pooled
machines of its neighbours add it (poolnodes.py `drop_peer`, `add_peer`, as the daemon's `Pooling`).
"""

from __future__ import annotations

import random
import time

from ...protocol.driver import UnknownEffect, carry_out
from ...protocol.effects import CancelTimer, SetTimer
from ...protocol.flow.pool import PoolMachine
from ...protocol.flow.poolnodes import (
    GIVE_UP_S, add_peer, drop_peer, holds_units, installed, over_links, pooled_machines, role_id, split_id,
)
from .events import FlowDeliver, PoolDeliver, PoolTimer
from .setting import MICROBATCHES

GIVE_UP = "give up"
POOLED = "pooled"  # the component part of a pooled machine's timer key


class _PoolOut:
    """The `protocol.driver.Driver` of one pooled machine (`role`) of simulated node `nid`."""

    def __init__(self, sim, nid: str, role: str) -> None:
        self.sim, self.nid, self.role = sim, nid, role

    def send(self, to: str, msg) -> None:
        self.sim._pool_send(self.nid, self.role, to, msg)

    def set_timer(self, key, deadline: float) -> None:
        self.sim._timer(self.sim._ftv, PoolTimer, self.nid, SetTimer(key, deadline), (POOLED, self.role))

    def cancel_timer(self, key) -> None:
        self.sim._timer(self.sim._ftv, PoolTimer, self.nid, CancelTimer(key), (POOLED, self.role))

    def compute(self, e) -> None:
        raise UnknownEffect(f"{self.nid}'s pooled {self.role or 'relay'} machine returned {e!r}: it does not compute")

    def flush(self) -> None:
        pass


class PoolDriver:
    """Part of `TrainSim` (driver.py): pooled formation, see the module docstring."""

    def _init_pooling(self) -> None:
        self.pooled: dict[str, dict[str, PoolMachine]] = {}  # node -> its pooled machines by role, until it hands over
        self._pool_queue: dict[str, list] = {}  # node -> per-data-node flow messages that wait for its hand-over
        self.pool_stats: dict = {}

    def _pooling_starts(self) -> bool:
        return bool(self.options.pooled_formation and self.machines and len(self._live_data()) > 1)

    def _start_pooling(self) -> None:
        """Every live node's pooled machines start (module doc)."""
        data = sorted(self._live_data())
        demand = {d: self.cap.get(d, MICROBATCHES) for d in data}
        for nid in sorted(self.nodes):
            if nid in self.dead:
                continue
            cfg = self._flow_config(nid, joined=False)
            self.pooled[nid] = pooled_machines(
                nid, nid not in self.data, cfg.capacity, data, demand, dict(cfg.next_costs), dict(cfg.prev_costs),
                cfg.peers, lambda vid: random.Random(f"{self.options.seed}:{vid}"))
        for nid in sorted(self.pooled):
            for role, pm in sorted(self.pooled[nid].items()):
                self._pool_carry(nid, role, pm.start(self.now))
            self._timer(self._ftv, PoolTimer, nid, SetTimer(GIVE_UP, self.now + GIVE_UP_S), (POOLED, ""))

    def _pool_carry(self, nid: str, role: str, effects: list) -> None:
        carry_out(_PoolOut(self, nid, role), effects, what=f"{nid}'s pooled {role or 'relay'} machine")

    def _pool_send(self, nid: str, role: str, to: str, msg) -> None:
        host, to_role = split_id(to)
        self.flow_messages += 1
        delay = 0.0 if host == nid else self.net.link(nid, host)[0] / 1000.0
        self._push(self.now + delay, PoolDeliver(host, to_role, role_id(nid, role), msg))

    def _on_pool_event(self, ev: PoolDeliver | PoolTimer) -> None:
        node = ev.node
        machines = self.pooled.get(node)
        if machines is None or node in self.dead:
            return  # (handed over: a late pooled message is ignored, as the daemon's)
        cpu0 = time.process_time()
        if type(ev) is PoolDeliver:
            role = ev.role
            pm = machines.get(role)
            eff = pm.on_message(self.now, ev.sender, ev.msg) if pm is not None else []
        else:
            if self._ftv.get((node, ev.key)) != ev.version:
                return
            (_, role), key = ev.key
            if key == GIVE_UP:
                self._hand_over(node)
                return
            eff = machines[role].on_timer(self.now, key)
        self.flow_cpu_s += time.process_time() - cpu0  # a metric only
        self._pool_carry(node, role, eff)
        if all(pm.homed for pm in machines.values()):
            self._hand_over(node)

    def _flow_to_pooling(self, ev: FlowDeliver) -> bool:
        """A per-data-node flow message for a node still pooled: it waits for the hand-over, or starts it when
        the node holds no pooled units (module doc).  False: not such a node."""
        if ev.node not in self.pooled:
            return False
        if holds_units(self.pooled[ev.node]):
            self._pool_queue.setdefault(ev.node, []).append((ev.sender, ev.msg))
            return True
        self._hand_over(ev.node)
        return False

    def _hand_over(self, nid: str) -> None:
        """`nid`'s flow machine starts with the units homing installed here over links it has (as the daemon's
        `Flows._hand_over`), and the messages that waited for it."""
        machines = self.pooled.pop(nid)
        inn, out = installed(machines)
        pool = machines.get("pool")
        if pool is not None and pool.homed:
            st = pool.stats
            self.pool_stats = {"homed_s": self.now, "traced": st.traced, "held": st.held}
        fm = self._make_flow(nid, joined=False)
        fm.adopt(over_links(inn, fm.cfg.prev_costs), over_links(out, fm.cfg.next_costs))
        self._fstamp.pop(nid, None)  # (its microbatch machine gets these flows: `_sync_flows`)
        self._apply_flow(nid, fm.start(self.now))
        for sender, msg in self._pool_queue.pop(nid, []):
            self._apply_flow(nid, fm.on_message(self.now, sender, msg))
        self._sync_flows(nid)

    def _pool_gone(self, gone: str) -> None:
        """The membership layer reports `gone`: each pooled machine linked to one of its machines drops the link."""
        self.pooled.pop(gone, None)
        for nid in sorted(self.pooled):
            if nid in self.dead:
                continue
            for role, eff in drop_peer(self.pooled[nid], self.now, gone):
                self._pool_carry(nid, role, eff)

    def _pool_add(self, nid: str, peer: str, cost: float, side: str) -> None:
        """A joiner `peer` is a link of pooled node `nid`: its machines that link by `side` add it (a data node as
        its source side before stage 0, its sink side after the last stage)."""
        for role, eff in add_peer(self.pooled[nid], self.now, peer, cost, side, self.data):
            self._pool_carry(nid, role, eff)
