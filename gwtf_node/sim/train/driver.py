"""The training simulator's driver: `TrainSim` holds the clock and the event queue, the network and the
simulated nodes, and runs every node's machines in virtual time (see the package docstring).  Its
mechanisms (churn, aggregation, all-reduce, flows, joining, the report) are the mixins of their modules."""

from __future__ import annotations

import math
import random
import statistics
import time

from ...protocol.effects import Send, SetTimer
from ...protocol.leader import LeaderConfig, LeaderMachine
from ...protocol.phases import CanTakeRule, OpenIteration, Phases
from ...protocol.recovery import Compute, RecoveryConfig, RecoveryNode
from ...protocol.recovery.priors import HOP_PRIOR_S, e2e_prior_s, hop_prior_s
from .aggregation import AggregationDriver
from .allreduce import AllReduceDriver
from .churn import ChurnDriver
from .events import (
    LEADER_MSGS, PHASE_MSGS, TENSOR_MSGS, ComputeDone, Crash, Deliver, EventQueue, FlowDeliver, FlowTimer, Gone,
    Halt, JoinLookup, JoinTimer, LeaveWaited, MachineTimer, PoolDeliver, PoolTimer, Reflow, Rejoin, SimEvent,
    StateArrives, StepRetry,
)
from .flows import FlowDriver
from .pooling import PoolDriver
from .scaled import ScaledDriver
from .interpret import interpret
from .joining import JOIN_MSGS, JoinDriver
from .node import SimNode
from .options import TrainSimOptions
from .report import IterStats, Reporting
from .setting import (
    ACTIVATION_MB, IDEAL_MB_S, MAX_SIM_S_PER_ITERATION, MICROBATCHES, SILENCE_S, STAGE_SIZES, Setting, compute_s,
)


class TrainSim(AggregationDriver, AllReduceDriver, ChurnDriver, FlowDriver, JoinDriver, PoolDriver, ScaledDriver,
               Reporting):
    """One Table II run in virtual time (package docstring), as `options` (a `TrainSimOptions`, options.py) say:
    the policy, churn and seed, the scripted crashes, the model switches.  `flow_cpu_s` sums the CPU time the flow
    machines took (GWTF's scheduler cost)."""

    machine_class = RecoveryNode  # every node's microbatch machine (a policy of its own may subclass it)

    def __init__(self, setting: Setting, options: TrainSimOptions = TrainSimOptions()) -> None:
        self.options = o = options.resolved()
        policy, seed = o.policy, o.seed
        self.setting = setting
        self.data: tuple[str, ...] = setting.data
        self.rng = random.Random(f"train:{seed}:{policy}:{o.churn}")
        self.crash_rng = random.Random(f"churn:{seed}:{o.churn}")  # same crash draws for both policies
        self.net = setting.net
        self.nodes: dict[str, SimNode] = {}  # every node, with its machines (node.py)
        self.reported_gone: set[str] = set()  # nodes the membership layer reported gone (everyone learns at once)
        self._init_churn()  # churn.py: leaves, the pause of an empty stage
        self.elections = 0
        self.dropped = 0
        self.observer = None  # tests: called as observer(node, "msg", (sender, msg)) / (node, "done", (key, kind))
        self.drop = None  # tests: drop(sender, to, msg) -> True loses that control message on the wire
        self.stage: dict[str, int] = {d: -1 for d in self.data}
        self.cap: dict[str, int] = {}
        self.dead: set[str] = set()
        self.idle_watchers: dict[str, dict[str, bool]] = {}  # a crashed relay -> relays near it not told (churn.py)
        self.queue = EventQueue()  # the events to come and the clock (events.py)
        self._tv: dict = {}
        self.drivers: dict = {}  # (node, machine) -> its SimDriver (interpret.py)
        self._link_free: dict[tuple[str, str], float] = {}
        self._token = 0
        self.iters: dict[int, IterStats] = {}
        self.last_iter_s = 600.0
        self.events = 0
        self.trace: list | None = None  # set to a list to record (kind, ...) tuples (docs/sim_train.md, "Traces")
        self._opened_once: set[int] = set()
        self.acts_on_gone = {"swarm": o.swarm_reacts_to == "membership", "random": o.swarm_reacts_to == "membership",
                             "gwtf": o.gwtf_acts_on_gone, "taskpool": o.gwtf_acts_on_gone}[policy]
        self._done_at: dict[tuple[str, int], float] = {}
        S = len(STAGE_SIZES)
        self.S = S
        for r, (s, c) in setting.relays.items():
            self.stage[r], self.cap[r] = s, c
        self._init_flows()  # flows.py: the flow machines, or the flows an oracle installs
        self._init_pooling()  # pooling.py: pooled formation first (`pooled_formation`)
        self._init_scaled()  # scaled.py: scaled formation first (`scaled_formation`)
        self._init_joining()  # joining.py: joiners, the leader's placement, stage states
        self._init_allreduce()  # allreduce.py: the rounds of the step
        for nid in list(self.data) + list(setting.relays):
            self._make(nid, self.stage[nid], self.cap.get(nid, MICROBATCHES))
        for d in self.data:
            self.nodes[d].leader = LeaderMachine(LeaderConfig(d, self.data), random.Random(f"{seed}:{d}:leader"))
        for t, nid in self.options.crash_plan:
            self._push(t, Crash(nid))

    def machine_policy(self) -> str:
        """The RecoveryConfig policy of the machines (a subclass running its own machine may differ)."""
        return self.options.policy

    def _peers(self, stage: int, nid: str, live_only: bool = True) -> list[str]:
        return [r for r, s in self.stage.items() if s == stage and r != nid and r not in self.dead
                and r not in self.data]

    def _prior(self, a: str, b: str, back: bool) -> float:
        """`a`'s expected hand-off -> Complete time to `b` before it measured one: the daemon's rule
        (protocol/recovery/priors.py: the link's transfer, d(a, b) without compute, plus a compute allowance), or
        with `priors="modelled"` the transfer plus `b`'s profiled compute times its capacity (what the simulator
        knows and a node does not)."""
        if self.options.priors == "links":
            return hop_prior_s(self._flow_cost(a, b))
        sb = self.stage[b]
        c = compute_s(sb, ("final" if back else "loss") if sb < 0 else ("backward" if back else "forward"))
        return self.net.transfer_s(a, b, ACTIVATION_MB) + c * max(1, self.cap.get(b, MICROBATCHES))

    def _e2e_prior(self, nid: str, nxt: list[str]) -> float:
        """A data node's expected launch -> final backward time before it measured one (`_prior`'s two rules;
        "modelled": 2 (S + 1) mean hops of the data nodes to stage 0, plus the ideal compute of a microbatch)."""
        if self.options.priors == "links":
            return e2e_prior_s(self.S, [self._flow_cost(nid, j) for j in nxt])
        if not hasattr(self, "_e2e"):
            hop = statistics.mean(self.net.transfer_s(a, b, ACTIVATION_MB) for a in self.data
                                  for b in self._peers(0, ""))
            self._e2e = 2 * (self.S + 1) * hop + IDEAL_MB_S  # launch -> final backward, no queueing
        return self._e2e

    def _make(self, nid: str, stage: int, cap: int, applied: int | None = None) -> RecoveryNode:
        S = self.S
        if stage < 0:
            nxt, prv = self._peers(0, nid), self._peers(S - 1, nid)
        else:  # (the daemon's microbatches use its flow links: `_flow_linked`)
            nxt = [j for j in (list(self._live_data()) if stage == S - 1 else self._peers(stage + 1, nid))
                   if self._flow_linked(nid, j)]
            prv = [j for j in (list(self._live_data()) if stage == 0 else self._peers(stage - 1, nid))
                   if self._flow_linked(j, nid)]
        cost = self._mb_cost
        prior = {j: self._prior(nid, j, False) for j in nxt}
        prior.update({j: self._prior(nid, j, True) for j in prv})
        e2e = self._e2e_prior(nid, nxt) if stage < 0 else 0.0
        cfg = RecoveryConfig(
            node_id=nid, stage=stage, last_stage=S - 1, capacity=cap, data_nodes=self._live_data(),
            next_peers={j: cost(nid, j) for j in nxt}, prev_peers={j: cost(nid, j) for j in prv},
            peer_capacity={j: self.cap.get(j, MICROBATCHES) for j in nxt + prv}, prior_s=prior,
            default_prior_s=HOP_PRIOR_S if self.options.priors == "links" else RecoveryConfig.default_prior_s,
            e2e_prior_s=e2e, policy=self.machine_policy(),
            swarm_assumed_capacity=MICROBATCHES, act_on_gone=self.acts_on_gone, lend=self.options.lend,
            one_wave=self.options.one_wave, fastest_unit=self.options.fastest_unit)  # (SWARM: greedy, ignores it)
        m = self.machine_class(cfg, random.Random(f"{self.options.seed}:{nid}"),
                         first_seq=(self.data.index(nid) * 10**6 if nid in self.data else 0))
        if self.options.policy == "gwtf" and nid in self.flows:
            m.set_flows(self.flows[nid])
        phases = Phases(nid, stage, S - 1, applied=self._iteration_now() if applied is None else applied,
                        can_take=CanTakeRule(self.options.can_take), wait_bound_s=self.options.phase_wait_bound_s,
                        fan_out=self.options.phase_fan_out, groups_by_digest=self.options.begin_groups == "digest")
        self.nodes[nid] = SimNode(nid, m, phases)
        return m

    def _timer(self, versions: dict, event: type, nid: str, e, component: str | None = None) -> None:
        """SetTimer / CancelTimer of `nid` (of one of its machines, `component`): a new version of its key (a
        pending firing of an older version is stale); SetTimer also schedules the firing, an `event`."""
        key = e.key if component is None else (component, e.key)
        k = (nid, key)
        v = versions[k] = versions.get(k, 0) + 1
        if type(e) is SetTimer:
            self._push(max(e.deadline, self.now), event(nid, key, v))

    @property
    def now(self) -> float:
        return self.queue.now

    def _push(self, t: float, event: SimEvent) -> None:
        self.queue.push(t, event)

    def crash_at(self, t: float, node: str) -> None:
        """Crash `node` at time `t` (tests and fault plans; `t` no earlier than `now`)."""
        self._push(t, Crash(node))

    def _it(self, it: int) -> IterStats:
        return self.iters.setdefault(it, IterStats())

    def _send(self, nid: str, e: Send) -> None:
        """A message on the wire: a tensor waits for its link (FIFO) and takes latency + size / bandwidth; a
        control message takes the latency (or is lost, if the `drop` hook says so)."""
        if type(e.msg) in TENSOR_MSGS:
            dur = self.net.transfer_s(nid, e.to, ACTIVATION_MB)
            lat = self.net.link(nid, e.to)[0] / 1000.0
            link = (nid, e.to)
            start = max(self.now, self._link_free.get(link, 0.0))
            self._link_free[link] = start + dur - lat
            self._it(e.msg.iteration).transfer_s += dur
            arrive = start + dur
            if self.trace is not None:
                self.trace.append(("xfer", start, arrive, nid, e.to, type(e.msg).__name__,
                                   (e.msg.data_node, e.msg.seq, e.msg.iteration), e.msg.attempt))
        else:
            if self.drop is not None and self.drop(nid, e.to, e.msg):
                self.dropped += 1
                return
            arrive = self.now + self.net.link(nid, e.to)[0] / 1000.0
            if self.trace is not None:
                m = e.msg
                self.trace.append(("ctl", self.now, arrive, nid, e.to, type(m).__name__,
                                   (getattr(m, "data_node", None), getattr(m, "seq", None),
                                    getattr(m, "iteration", None)), getattr(m, "attempt", None)))
        self._push(arrive, Deliver(e.to, nid, e.msg))

    def _apply(self, nid: str, effects: list) -> None:
        """The microbatch machine's effects (interpret.py)."""
        interpret(self, nid, "rec", effects)

    def _start_compute(self, nid: str, e: Compute) -> None:
        """A computation waits for the node's compute queue and takes its profiled time."""
        n = self.nodes[nid]
        dur = compute_s(self.stage[nid], e.kind)
        start = max(self.now, n.busy_until)
        end = start + dur
        n.busy_until = end
        self._token += 1
        self._push(end, ComputeDone(nid, e.kind, e.key, dur, start, self._token))

    def _rec_opens(self, nid: str, e: OpenIteration) -> None:
        self._on_open(nid, e.iteration)

    def _unpresume(self, nid: str) -> None:
        """The daemon's liveness check: a peer the machine presumed dead that is still heard (alive, or
        crashed less than SILENCE_S ago) is alive again for it.

        It looks only at a node that may presume a peer dead (`SimNode.presuming`): one whose machine presumed
        a peer dead since it last looked (its `presumed_dead` counter moved: the only way a peer becomes dead
        without being reported gone, besides a gone peer back as a neighbour, `_add_node`), until it finds
        none left."""
        n = self.nodes[nid]
        if not self.options.unpresume:
            return
        rec = n.rec
        count = rec.stats.presumed_dead
        if count != n.presumed_seen:
            n.presumed_seen, n.presuming = count, True
        if not n.presuming:
            return
        presumed = rec.dead - rec.gone
        if not presumed:
            n.presuming = False
            return
        for p in sorted(presumed):
            c = self.crashed_at.get(p)
            if c is None or self.now - c < SILENCE_S:
                self._apply(nid, rec.peer_alive(self.now, p))

    def _mb_cost(self, a: str, b: str) -> float:
        """The microbatch machines' cost of a link: the activation's transfer both ways."""
        return self.net.transfer_s(a, b, ACTIVATION_MB) + self.net.transfer_s(b, a, ACTIVATION_MB)

    def _mb_link(self, a: str, b: str, cap: int | None = None, sides: tuple[str, ...] = ("up", "down")) -> None:
        """A flow link from `a` to the next-stage `b` came (the daemon's `_sync_rec`): `a`'s microbatch machine takes
        `b` as a next hop (capacity `cap`, or `b`'s) on side "up", `b`'s takes `a` as a previous hop on "down"."""
        for side in sides:
            p, q = (a, b) if side == "up" else (b, a)
            rec = self.nodes[p].rec
            self._unpresume(p)
            if side == "up":
                self._apply(p, rec.set_neighbours(self.now, {**rec.next_peers, q: self._mb_cost(p, q)}, rec.prev_peers,
                                                  {q: self.cap.get(q, MICROBATCHES) if cap is None else cap},
                                                  self._prior(p, q, False)))
            else:
                self._apply(p, rec.set_neighbours(self.now, rec.next_peers, {**rec.prev_peers, q: self._mb_cost(p, q)},
                                                  {}, {q: self._prior(p, q, True)}))
            self._neighbour_back(p, q)

    def _neighbour_back(self, nid: str, peer: str) -> None:
        """`peer` became a neighbour of `nid`: if `nid`'s machine knew it as gone, it is dead and no longer gone
        there now (`Peers.set_links`), so the liveness check looks at `nid` again (`_unpresume`)."""
        if peer in self.nodes[nid].rec.dead:
            self.nodes[nid].presuming = True

    def _on_open(self, nid: str, it: int) -> None:
        self._it(it).opened[nid] = self.now
        if it == 0:  # the flows are formed at the last data node's first open (GWTF's scheduler cost)
            self.formation = {"formed_s": self.now, "flow_messages": self.flow_messages, "flow_cpu_s": self.flow_cpu_s}
        if self.trace is not None:
            self.trace.append(("open", self.now, nid, it))
        if it > 0:
            self._it(it - 1).closed[nid] = self.now
        if it in self._opened_once:
            return
        self._opened_once.add(it)  # the first data node to open `it`: membership changes take effect now
        if it > 0:
            prev = self.iters[it - 1].opened.get(nid)
            if prev is not None:
                self.last_iter_s = max(60.0, self.now - prev)
        # joiners whose download finished come in now
        ready = [j for j in self.pending_joins if j[0] <= self.now]
        self.pending_joins = [j for j in self.pending_joins if j[0] > self.now]
        for _, old, stage, cap in ready:
            self._join(old, stage, cap)
        self._ready_joiners_at_open()
        if self.routing == "dtfm" and self.options.reflow:  # a static schedule: recomputed only when joiners came in
            if ready:
                self._push(self.now + self._settle_s(), Reflow())
        elif self.options.policy == "gwtf" and self.options.reflow:
            # joiners ran the flow machines since their download finished: settled FLOW_CONVERGE_S after that
            settle = max((t for t, *_ in ready), default=-math.inf) + self._settle_s()
            if settle <= self.now:
                self._install(self._live_members(), self._live_data())
            else:
                if self._lent:  # every data node has microbatches again: the flows shared by all of them
                    self._install(self._flow_members, self._live_data())
                self._push(settle, Reflow(self._live_members()))
        if self.options.churn > 0:
            for r in sorted(self.stage):
                if r in self.data or r in self.dead:
                    continue
                if self.crash_rng.random() < self.options.churn:
                    self._push(self.now + self.crash_rng.random() * self.last_iter_s, Crash(r, churn=True))

    def _live_data(self) -> tuple[str, ...]:
        return tuple(d for d in self.data if d not in self.dead)

    def _join_now(self, old: str) -> None:
        """A joiner whose download finished joins at once while its stage's parameters are the iteration's:
        not while an aggregation is under way (then: at the next open, with the new parameters)."""
        if not self.options.join_mid_iteration:
            return
        if self._aggregating():
            return
        for j in [j for j in self.pending_joins if j[1] == old]:
            self.pending_joins.remove(j)
            self._join(old, j[2], j[3])
            if self.options.policy == "gwtf" and self.options.reflow:
                self._push(self.now + self._settle_s(), Reflow(self._live_members()))

    def _join(self, old: str, stage: int, cap: int) -> None:
        """`joining="restart"`: the relay is back in its stage (a new id)."""
        self.joiner_count += 1
        nid = f"{old.split('~')[0]}~{self.joiner_count}"
        self.net.loc[nid] = self.net.loc[old]  # the same machine, restarted
        self._add_node(nid, stage, cap)

    def _add_node(self, nid: str, stage: int, cap: int, applied: int | None = None) -> None:
        """A joiner comes in: its machines start and its neighbours take it (discovery: its Hello)."""
        self.joins += 1
        self.stage[nid], self.cap[nid] = stage, cap
        self._link_joiner(nid)
        self._make(nid, stage, cap, applied)
        if self.machines:
            self._started.add(nid)
            self._flow_joined(nid)
        S = self.S
        prv = list(self._live_data()) if stage == 0 else self._peers(stage - 1, nid)
        nxt = list(self._live_data()) if stage == S - 1 else self._peers(stage + 1, nid)
        for p in prv:  # (discovery: the joiner is a next-stage peer of these, as the daemon's `_sync_rec`)
            if self._flow_linked(p, nid):
                self._mb_link(p, nid, cap, ("up",))
        for p in nxt:
            if (p in self.data and stage != S - 1) or not self._flow_linked(nid, p):
                continue
            self._mb_link(nid, p, sides=("down",))
        if self.paused:  # a relay for an empty stage: the paused data nodes may open (churn.py)
            self._recheck_paused()

    def run(self, iterations: int, until: float | None = None) -> None:
        """Run until every live data node trained `iterations` (or nothing is left to happen); with `until`, stop
        at that virtual time at the latest (a later call goes on from there)."""
        halt = self._begin(until)  # (churn.py)
        limit = MAX_SIM_S_PER_ITERATION * (iterations + 1)
        handlers = {  # event type -> its handler; a handler that returns True ends the run
            Deliver: self._on_deliver, MachineTimer: self._on_machine_timer, ComputeDone: self._on_compute_done,
            FlowDeliver: self._on_flow_event, FlowTimer: self._on_flow_event,
            PoolDeliver: self._on_pool_event, PoolTimer: self._on_pool_event,
            Crash: self._on_crash, Gone: lambda ev: self._on_gone(ev.node, ev.later, ev.late),
            Reflow: lambda ev: self._on_reflow(ev.members), Rejoin: self._on_rejoin,
            JoinLookup: lambda ev: self._lookup_leader(ev.node), JoinTimer: self._on_join_timer,
            StateArrives: lambda ev: self._state_arrived(ev.node, ev.source, ev.steps),
            StepRetry: lambda ev: self._allreduce_retry(ev.key),
            LeaveWaited: lambda ev: self._leave_timeout(ev.node, ev.iteration),
            Halt: lambda ev: halt is not None and ev.token == halt,
        }
        while not all(self.nodes[d].rec.iteration >= iterations for d in self._live_data()):
            event = self.queue.pop(limit)
            if event is None or handlers[type(event)](event):
                break

    def _on_crash(self, ev: Crash) -> None:
        if ev.churn and self._spared(ev.node):
            return
        self._crash(ev.node)

    def _on_rejoin(self, ev: Rejoin) -> None:
        if self.options.joining == "machines":  # the crashed relay's machine is back: it asks the leader
            self._restart_as_joiner(ev.node)
        else:  # a joiner's download finished: it serves the iteration in training now
            self._join_now(ev.node)

    def _on_join_timer(self, ev: JoinTimer) -> None:
        if self._tv.get((ev.node, ev.key)) == ev.version:
            self._join_timer(ev.node, ev.key)

    def _on_flow_event(self, ev: FlowDeliver | FlowTimer) -> None:
        node = ev.node
        if node in self.dead:
            fm = self.fnodes.get(ev.sender) if type(ev) is FlowDeliver else None
            if fm is not None and any(v.get(node) for v in fm.out.values()):
                self._comes_to_work(ev.sender, node)  # (it moved a unit of flow to the dead relay)
            return
        if type(ev) is FlowDeliver and self.pooled and self._flow_to_pooling(ev):
            return
        fm = self._flow_member(node)  # (its scaled formation's host while it has one: scaled.py)
        cpu0 = time.process_time()
        if type(ev) is FlowDeliver:
            eff = fm.on_message(self.now, ev.sender, ev.msg)
        elif self._ftv.get((node, ev.key)) == ev.version:
            eff = fm.on_timer(self.now, ev.key)
        else:
            return
        self.flow_cpu_s += time.process_time() - cpu0  # a metric only: it decides nothing
        self._scaled_effects(node, eff)
        self._sync_flows(node)

    def _on_deliver(self, ev: Deliver) -> None:
        """A message to `node`: to its joining, aggregation phase, election or microbatch machine."""
        node, sender, msg = ev.node, ev.sender, ev.msg
        mt = type(msg)
        if mt in JOIN_MSGS:
            self._join_message(node, sender, msg)
            return
        if node in self.dead:
            self._comes_to_work(sender, node)
            return
        m = self.nodes[node].rec
        self.events += 1
        if self.observer is not None:
            self.observer(node, "msg", (sender, msg))
        if mt in PHASE_MSGS:
            self._phase_message(node, sender, msg)
        elif mt in LEADER_MSGS:
            if self.nodes[node].leader is not None:
                self._leader_event(node, self.nodes[node].leader.on_message(self.now, sender, msg))
        else:
            self._unpresume(node)
            ph = self.nodes[node].phases
            if node not in self.data and ph is not None and ph.applied >= 0:  # (the daemon: its part's steps)
                m.parameters_at(ph.applied)
            self._apply(node, m.on_message(self.now, sender, msg))
        self._after_node_event(node, m)

    def _on_machine_timer(self, ev: MachineTimer) -> None:
        node = ev.node
        if node in self.dead:
            return
        m = self.nodes[node].rec
        self.events += 1
        if self._tv.get((node, ev.key)) != ev.version:
            return
        component, key = ev.key
        if component == "rec":
            self._unpresume(node)
            self._apply(node, m.on_timer(self.now, key))
        elif component == "phase":
            self._apply_phase(node, self.nodes[node].phases.on_timer(self.now, key))
        else:
            self._leader_event(node, self.nodes[node].leader.on_timer(self.now, key))
        self._after_node_event(node, m)

    def _on_compute_done(self, ev: ComputeDone) -> None:
        node = ev.node
        if node in self.dead:  # (a computation cut short by the crash is not counted)
            return
        m = self.nodes[node].rec
        self.events += 1
        if ev.kind == "aggregate":
            if not self._round_done(node, ev.token):
                return
        else:
            self._it(ev.key[2]).compute_s += ev.seconds
        if self.trace is not None:
            self._trace_compute(node, m, ev.kind, ev.key, ev.seconds, ev.start)
        if ev.kind == "aggregate":
            self._step_done(node, ev.key[1])
        else:
            self._unpresume(node)
            self._apply(node, m.on_compute_done(self.now, ev.key, ev.kind))
        if self.observer is not None:
            self.observer(node, "done", (ev.key, ev.kind))
        self._after_node_event(node, m)

    def _after_node_event(self, node: str, m) -> None:
        """A data node whose microbatches of its iteration are all settled: the time is noted, and the flows
        of the data nodes still at work may be recomputed."""
        if node in self.data and (node, m.iteration) not in self._done_at and m.iteration in m.reported:
            self._done_at[(node, m.iteration)] = self.now
            if len(self._active()) > 0:
                self._schedule_reflow(done=True)

    def _on_gone(self, gone: str, later: tuple[str, ...] = (), late: bool = False) -> None:
        """The membership layer tells every live node that `gone` is gone (but `later`; `late`: only `later`).
        The aggregation phase always hears it (the all-reduce needs the live group); the flow and microbatch
        machines only with `detect` (without it they find crashes by their own timeouts)."""
        if late and gone in self.idle_watchers:  # (each told once: the first of its two reports)
            later = tuple(n for n in later if self.idle_watchers[gone].pop(n, None) is not None)
        if not late:
            self.reported_gone.add(gone)
            self._placement_gone(gone)
            self._source_gone(gone)
            if self.options.detect and self.machines:
                self._flow_gone(gone, later)
        for nid in sorted(self.nodes):
            if nid in self.dead or nid == gone or (nid in later) != late:
                continue
            nxt, prv = self._next_prev(nid)
            self._apply_phase(nid, self.nodes[nid].phases.forget(self.now, gone, nxt, prv))
            if self.options.detect:
                self._apply(nid, self.nodes[nid].rec.peer_gone(self.now, gone))
                if nid in self.data:  # as the daemon: with its first stage empty, what needs it is given up
                    self._apply(nid, self.nodes[nid].rec.give_up_stranded(self.now))
        if late:
            if self.options.detect and self.machines:
                self._flow_gone(gone, later, late=True)
            return
        for d in self._live_data():
            if self._leading(d):
                self._apply_phase(d, self._maybe_begin(d))
        self._allreduce_gone(gone)  # a round that waits for it is redone among the survivors

    def _trace_compute(self, node: str, m, ckind: str, key, dur: float, start: float) -> None:
        self.trace.append(("compute", start, self.now, node, ckind, key, dur))
        if ckind == "final" and node in self.data:
            dm = getattr(m, "mbs", {}).get(key)
            if dm is not None:
                self.trace.append(("path", self.now, key, tuple(dm.path), dm.attempt, dm.round.count))
