"""The aggregation phase (`protocol.phases.Phases`) and the election (`protocol.leader.LeaderMachine`) on every
node, and the step on the compute queue.
"""

from __future__ import annotations

from ...protocol.messages import BeginAggregation, IterationDone, PhaseAck
from ...protocol.phases import LeftOut, OpenIteration, OutOfStep, StartStep
from ...protocol.recovery import IterationSettled
from .interpret import interpret


class AggregationDriver:
    """Part of `TrainSim` (driver.py): one mechanism of the simulator, see the module docstring."""

    def _known(self, stage: int) -> list[str]:
        """The nodes of `stage` (-1: the data nodes) the membership layer has not reported gone: what every
        node knows (crashed ones until their report, joiners once announced)."""
        if stage < 0:
            return [d for d in self.data if d not in self.reported_gone]
        return sorted(r for r, s in self.stage.items() if s == stage and r not in self.reported_gone
                      and r in self.nodes and r not in self.data)

    def _next_prev(self, nid: str) -> tuple[list[str], list[str]]:
        st, last = self.stage[nid], self.S - 1
        if st < 0:
            return self._known(0), self._known(last)
        return (self._known(-1) if st == last else self._known(st + 1),
                self._known(-1) if st == 0 else self._known(st - 1))

    def _groups(self, iteration: int) -> dict[int, list[str]]:
        """Who takes part in each stage's aggregation of `iteration`: the known nodes, less the relays that leave
        before it (churn.py)."""
        return {k: [r for r in self._known(k) if self._ready_for(r, iteration)] for k in range(-1, self.S)}

    def _iteration_now(self) -> int:
        """The iteration the live data nodes are in (the newest one opened): a joiner's parameters are its."""
        live = [self.nodes[d].phases.iteration for d in self.data if d in self.nodes and d not in self.dead]
        return max(live, default=0)

    def _leading(self, nid: str) -> bool:
        n = self.nodes.get(nid)
        lm = None if n is None else n.leader
        return lm is not None and lm.is_leader(self.now)

    def _maybe_begin(self, nid: str) -> list:
        """The acting leader opens the aggregation of every iteration whose reports it holds."""
        ph = self.nodes[nid].phases
        eff: list = []
        for it in ph.pending_iterations():
            eff += ph.maybe_begin(self.now, it, leading=self._leading(nid), data_nodes=self._known(-1),
                                  stage0=self._known(0), groups=self._groups(it))
        return eff

    def _report_settled(self, nid: str, e: IterationSettled) -> None:
        """A data node's iteration is settled: its report goes to the leader (at the leader: maybe BEGIN)."""
        ph = self.nodes[nid].phases
        eff = ph.report_done(self.now, IterationDone(e.iteration, e.completed, 0.0, e.deferred,
                                                     completed_seqs=e.completed_seqs,
                                                     completed_attempts=e.completed_attempts,
                                                     completed_holders=e.completed_holders))
        if self._leading(nid):
            eff += self._maybe_begin(nid)
        self._apply_phase(nid, eff)

    def _apply_phase(self, nid: str, effects: list) -> None:
        """The aggregation phase's effects (interpret.py): control messages, its retransmission timers, the
        step."""
        interpret(self, nid, "phase", effects)
        if nid in self.leaving:  # its CAN TAKE of its last iteration may be sent: Goodbye (churn.py)
            self._maybe_goodbye(nid)

    def _phase_step(self, nid: str, e: StartStep | LeftOut | OutOfStep) -> None:
        """BEGIN reached this node (a relay drops what is left of the iteration): it steps, or it takes the
        stage state of the iteration after the step from a stage peer (joining.py)."""
        rec = self.nodes[nid].rec
        if e.iteration not in rec.begun:
            completed = self.nodes[nid].phases.completed_in(e.iteration)
            self._apply(nid, rec.begin_aggregation(self.now, e.iteration, completed)[0])
        if type(e) is StartStep:
            self._start_step(nid, e.iteration)
        else:
            if type(e) is OutOfStep:
                self._allreduce_absent(nid, e.iteration)
            self._resync(nid, e.iteration)

    def _phase_opens(self, nid: str, e: OpenIteration) -> None:
        self._open_or_pause(nid, e.iteration)

    def _step_done(self, nid: str, it: int) -> None:
        self._apply(nid, self.nodes[nid].rec.aggregation_done(self.now, it))
        nxt, prv = self._next_prev(nid)
        self._apply_phase(nid, self.nodes[nid].phases.on_step_done(self.now, it, nxt, prv))
        self._serve_state(nid)  # state requests that waited for this step

    def _phase_message(self, nid: str, sender: str, msg) -> None:
        ph = self.nodes[nid].phases
        nxt, prv = self._next_prev(nid)
        t = type(msg)
        if t is PhaseAck:
            eff = ph.on_ack(self.now, sender, msg)
        elif t is IterationDone:
            eff = ph.on_iteration_done(self.now, sender, msg, leading=self._leading(nid), data_nodes=self._known(-1),
                                       stage0=self._known(0), groups=self._groups(msg.iteration))
        elif t is BeginAggregation:
            eff = ph.on_begin(self.now, sender, msg, nxt)
        else:
            eff = ph.on_can_take(self.now, sender, msg, nxt, prv)
        self._apply_phase(nid, eff)

    def _leader_event(self, nid: str, effects: list) -> None:
        """The election's effects (interpret.py); a change of the leader this data node knows goes to its
        Phases."""
        interpret(self, nid, "leader", effects)
        lead = self.nodes[nid].leader.leader(self.now)
        self._leadership_changed(nid)
        if lead == self.nodes[nid].leader_seen:
            return
        self.nodes[nid].leader_seen = lead
        if lead == nid:
            self.elections += 1
        front = self._known(-1) + self._known(0)
        eff = self.nodes[nid].phases.set_leader(self.now, lead, front=front)
        if lead == nid:
            eff += self._maybe_begin(nid)
        self._apply_phase(nid, eff)

    def _aggregating(self) -> bool:
        """An aggregation is under way: a live data node began its iteration's (until it opens the next)."""
        return any(self.nodes[d].phases.iteration in self.nodes[d].phases.begun for d in self._live_data())
