"""GWTF's flows during training: the flow machines run in virtual time (or the oracle's optimum), handed to the
microbatch machines.
"""

from __future__ import annotations

import random

from ...protocol.effects import Send
from ...protocol.flow import FlowConfig, FlowNode, flows_formed
from ...protocol.neighbourhood import auto_whole, chosen, joiner_links, refill
from .events import FlowDeliver, Reflow
from .interpret import interpret
from .setting import (
    FLOW_CONVERGE_S, MICROBATCHES, Setting,
    initial_flows,
)


class FlowDriver:
    """Part of `TrainSim` (driver.py): one mechanism of the simulator, see the module docstring."""

    def _init_flows(self) -> None:
        """GWTF's flows: the flow machines (`protocol/flow/`), run in this virtual time (docs/sim_train.md), or the
        optimum of the routing LP installed by an oracle (`routing="oracle"`, the model before the machines ran)."""
        o, setting = self.options, self.setting
        self.machines = o.machines
        self.routing = o.routing if o.policy == "gwtf" else "greedy"
        if self.machines:
            self.flows = {}
        else:
            flows = o.scheduler.flows if o.routing == "dtfm" else o.flows
            self.flows = flows if flows is not None else (initial_flows(setting) if o.policy == "gwtf" else {})
        self.fnodes: dict[str, FlowNode] = {}
        self._ftv: dict = {}
        self._fstamp: dict[str, float] = {}
        self._started: set[str] = set()
        self.flow_messages = 0
        self.flow_cpu_s = 0.0
        self.formation: dict = {}
        self.reflows = 0
        self._lent = False
        self._flow_members = dict(setting.relays)
        # scaled formation and the bound K: as given, or auto's choice (neighbourhood.py), as the daemon's
        self._scaled, self._k = auto_whole(o.scaled_formation, o.flow_neighbours, len(setting.data),
                                           len(setting.relays), self.S)
        if not (self.machines and o.policy == "gwtf"):
            self._scaled, self._k = False, 0
        self._flinks: set[tuple[str, str]] | None = None  # (upstream, downstream) relay links; None: every one
        if self._k > 0:
            self._flinks = set()
            for r in sorted(setting.relays):
                self._flinks |= chosen(r, self._relays_beside(r, 1), self._relays_beside(r, -1), self._k)

    def _relays_beside(self, nid: str, step: int) -> dict[str, float]:
        """The live relays of the stage `step` after `nid`'s (-1: before), by the cost of the flow link."""
        st = self.stage[nid] + step
        if st < 0 or st >= self.S:
            return {}
        return {j: (self._flow_cost(nid, j) if step > 0 else self._flow_cost(j, nid)) for j in self._peers(st, nid)}

    def _flow_linked(self, a: str, b: str) -> bool:
        """Whether `a` and the next-stage `b` are linked (the daemon's flow links, which its microbatches use)."""
        return self._flinks is None or a in self.data or b in self.data or (a, b) in self._flinks

    def _link_joiner(self, nid: str) -> None:
        """A joiner's links: its own choice, and the previous-stage relays that take it (`takes_newcomer`)."""
        if self._flinks is None:
            return
        prv = self._relays_beside(nid, -1)
        kept = {a: {j: x for j, x in self._relays_beside(a, 1).items() if (a, j) in self._flinks and j != nid}
                for a in prv}
        self._flinks |= joiner_links(nid, self._relays_beside(nid, 1), prv, kept, self._k)

    def _refill(self, nid: str) -> None:
        """`nid` lost a next-stage relay: it links to the cheapest others up to the bound, both machines of both
        ends told (the daemon's `Flows._refill`, its LinkCost adding the link downstream)."""
        fm = self.fnodes[nid]
        kept = [j for j in fm.cfg.next_costs if j not in self.data]
        for p in sorted(refill(kept, self._relays_beside(nid, 1), self._k)):
            self._flinks.add((nid, p))
            cost = self._flow_cost(nid, p)
            self._scaled_effects(nid, self._flow_member(nid).add_neighbour(self.now, p, cost, "next"))
            if p in self.pooled:
                self._pool_add(p, nid, cost, "prev")  # (pooled formation: pooling.py)
            else:
                self._scaled_effects(p, self._flow_member(p).add_neighbour(self.now, nid, cost, "prev"))
            self._mb_link(nid, p)

    def _flow_cost(self, a: str, b: str) -> float:
        """d(a, b) of Equation 1 (ms), as `parse_scenario` computes it for `_scenario`'s links."""
        return self.net.flow_cost(a, b)

    def _make_flow(self, nid: str, joined: bool) -> FlowNode:
        """A flow machine with `_flow_config`."""
        fm = FlowNode(self._flow_config(nid, joined), random.Random(f"{self.options.seed}:{nid}"))
        self.fnodes[nid] = fm
        self._fstamp[nid] = fm.stats.last_change
        return fm

    def _flow_config(self, nid: str, joined: bool) -> FlowConfig:
        """What discovery gives `nid` now: its links to the live adjacent stages (data nodes for the first / last
        stage), its live same-stage relays, the data nodes (as `flowsim.flow_configs`)."""
        S, st = self.S, self.stage[nid]
        data = self._live_data()
        if st < 0:
            nxt, prv, peers = self._peers(0, nid), self._peers(S - 1, nid), ()
        else:
            nxt = [j for j in (list(data) if st == S - 1 else self._peers(st + 1, nid)) if self._flow_linked(nid, j)]
            prv = [j for j in (list(data) if st == 0 else self._peers(st - 1, nid)) if self._flow_linked(j, nid)]
            peers = tuple(sorted(self._peers(st, nid)))
        return FlowConfig(nid, st < 0, self.cap.get(nid, MICROBATCHES), tuple(self.data),
                          {j: self._flow_cost(nid, j) for j in sorted(nxt)},
                          {j: self._flow_cost(j, nid) for j in sorted(prv)}, peers, joined=joined,
                          **self.options.flow_options)

    def _apply_flow(self, nid: str, effects: list) -> None:
        """A flow machine's effects (interpret.py): control messages (the link's latency) and its own timers."""
        interpret(self, nid, "flow", effects)

    def _send_flow(self, nid: str, e: Send) -> None:
        self.flow_messages += 1
        self._push(self.now + self.net.link(nid, e.to)[0] / 1000.0, FlowDeliver(e.to, nid, e.msg))

    def _sync_flows(self, nid: str) -> None:
        """Hand the node's microbatch machine its flow machine's flows when they changed (as the daemon's
        `_sync_rec`); a data node opens iteration 0 once its flows formed (as the daemon's `_wait_flows`).  A node
        whose scaled formation runs has no flows yet (scaled.py; the daemon starts its flow machine at the end)."""
        if self._forming(nid):
            return
        fm = self.fnodes[nid]
        changed = fm.stats.last_change != self._fstamp.get(nid)
        if changed:
            self._fstamp[nid] = fm.stats.last_change
        if nid in self._started:
            if changed:
                self._apply(nid, self.nodes[nid].rec.set_flows(fm.out, now=self.now))
            return
        placed = sum(fm.out.get(nid, {}).values())
        quiet = self.now - fm.stats.last_change
        if flows_formed(placed, fm.cfg.capacity, quiet, self.now):
            self._started.add(nid)
            self.nodes[nid].rec.set_flows(fm.out)
            if nid in self.data and self.options.pause_empty:  # iteration 0 too waits for every stage (churn.py)
                self._open_or_pause(nid, 0)
            else:
                self._apply(nid, self.nodes[nid].rec.start(self.now))

    def _flow_gone(self, gone: str, later: tuple[str, ...] = (), late: bool = False) -> None:
        """The membership layer reports `gone`: every live flow machine linked to it removes it (the daemon's
        `_forget_peer`; but those in `later`, or with `late` only those); the machines re-form the flows through it
        with their own messages.  Pooled machines drop theirs at once (pooling.py)."""
        if self.pooled and not late:
            self._pool_gone(gone)
        for nid in sorted(self.fnodes):
            if nid in self.dead or nid == gone or (nid in later) != late:
                continue
            fm = self.fnodes[nid]
            c = fm.cfg
            if gone in c.next_costs or gone in c.prev_costs or gone in c.peers:
                self._scaled_effects(nid, self._flow_member(nid).remove_neighbour(self.now, gone))
                if self._flinks is not None and gone in c.next_costs and nid not in self.data:
                    self._refill(nid)
                self._sync_flows(nid)

    def _flow_joined(self, nid: str) -> None:
        """A joiner starts its flow machine (`FlowConfig.joined`); its neighbours add it (the daemon's
        `_add_flow_neighbour`)."""
        self._scaled_joined(nid)  # (scaled.py: a joiner forms with the flow machines)
        fm = self._make_flow(nid, joined=True)
        self._apply_flow(nid, fm.start(self.now))
        for j in sorted(set(fm.cfg.prev_costs) | set(fm.cfg.next_costs) | set(fm.cfg.peers)):
            other = self.fnodes.get(j)
            if (other is None and j not in self.pooled) or j in self.dead:
                continue
            if j in fm.cfg.prev_costs:
                side, cost = "next", fm.cfg.prev_costs[j]
            elif j in fm.cfg.next_costs:
                side, cost = "prev", fm.cfg.next_costs[j]
            else:
                side, cost = "peer", 0.0
            if other is None:
                self._pool_add(j, nid, cost, side)  # (pooled formation: pooling.py)
                continue
            self._scaled_effects(j, self._flow_member(j).add_neighbour(self.now, nid, cost, side))
            self._sync_flows(j)
        self._sync_flows(nid)

    def _live_members(self) -> dict[str, tuple[int, int]]:
        return {r: (self.stage[r], self.cap[r]) for r in self.stage if r not in self.data and r not in self.dead}

    def _settle_s(self) -> float:
        """How long after a change the new flows are in place: the flow machines' convergence (oracle), or
        DT-FM's recomputation (its CPU time)."""
        return self.options.scheduler.delay_s if self.routing == "dtfm" else FLOW_CONVERGE_S

    def _schedule_reflow(self, done: bool = False) -> None:
        """A change the flow machines see now (a crash, joiners, a data node done): they settle FLOW_CONVERGE_S
        later on what they saw now.  DT-FM's schedule: only a crash counts (not a data node done: a static
        schedule does not lend), recomputed once the membership layer reported it (`detect_s`)."""
        if self.options.policy != "gwtf" or not self.options.reflow:
            return
        if self.routing == "dtfm":
            if not done:
                self._push(self.now + self.options.detect_s + self._settle_s(), Reflow())
            return
        self._push(self.now + FLOW_CONVERGE_S, Reflow(self._live_members()))

    def _active(self) -> tuple[str, ...]:
        """Data nodes with microbatches of their current iteration left (or already in the next one)."""
        top = max(self.nodes[d].rec.iteration for d in self._live_data())
        return tuple(d for d in self._live_data()
                     if self.nodes[d].rec.iteration < top or self.nodes[d].rec.iteration not in self.nodes[d].rec.reported)

    def _on_reflow(self, members: dict | None) -> None:
        if self.routing == "dtfm":  # the recomputation sees the members as they are when it completes
            self._install(self._live_members(), self._live_data())
            return
        active = self._active()
        done_at = [self._done_at.get((d, self.nodes[d].rec.iteration)) for d in self._live_data() if d not in active]
        if any(t is None or t > self.now - FLOW_CONVERGE_S + 1e-9 for t in done_at):
            active = self._live_data() if done_at else active  # a data node's demand went to 0 too recently to be seen
        self._install(members, active)

    def _install(self, members: dict, active: tuple[str, ...]) -> None:
        """The flows the flow machines converge to for `members` and the `active` data nodes, on every live node."""
        if any(not any(s == k for s, _ in members.values()) for k in range(self.S)):
            return  # a stage with no relay: no flow at all; the nodes keep their local repairs
        if self.routing == "dtfm":
            flows = self.options.scheduler.reflows(members, active, self.S)
        else:
            flows = initial_flows(Setting(self.setting.name, members, self.net), active)
        self.reflows += 1
        self._flow_members = members
        self._lent = tuple(active) != self._live_data()
        for nid in sorted(self.nodes):
            if nid not in self.dead:
                self._apply(nid, self.nodes[nid].rec.set_flows(flows.get(nid, {}), now=self.now))
