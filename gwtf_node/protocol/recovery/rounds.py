"""A data node's recovery decisions: its watchdog, GWTF's probe rounds and `_decide`, SWARM's restarts, giving an
attempt up.

`Rounds` decides; it changes only each record's `RoundState` (rounds so far,
probes out, answers) and asks the data side for the rest (`DataSide.reroute`,
`resend_loss_grad`, `restart`, `give_up`).

Backward pass, GWTF (V-D)
-------------------------
The sink computes the loss and sends `Backward` to the last relay; each
relay computes its backward, adds the microbatch to its contributions, sends
`Complete` downstream and the gradient upstream, and waits for the upstream
`Complete`; missing: `BackwardStuck` to the data node (the paper's "it
notifies the data node").  The data node (on `BackwardStuck`, on its own
hop deadline, or on its watchdog) runs a *round*: probe, then `_decide`:

* g = the lowest stage whose holder has computed its backward (bwd, grad,
  done), else the sink.  Stages below g still need their stashed activation.
* A *bad* stage below g is one whose holder is dead or holds nothing.  For
  each run a..b of bad stages, the live holder of stage a-1 (the data node
  if a = 0) is ordered to send its stash (`Recover`) to a live node of stage
  a chosen by its flows; that node recomputes stage a's forward, goes on to
  stage a+1 the same way while it is bad, and at the first good stage sends
  `Resume`: that node links its upstream to the recovering node and, if it
  holds its gradient, resends it.  The order carries the holders after the
  run up to the next bad stage (`rest`), so if the node to resume at died
  meanwhile its stage is recomputed too and the chain resumes at the next
  one.  A `Resume` is a control message answered at once: its deadline is
  `probe_wait_s + margin_s`, and its answer is not a hand-off time sample.
  The backward resumes from the stored
  gradient: one stage forward recomputed per crashed stage, no pipeline
  restart.
* No bad stage: if stage g is computing, nothing to do; otherwise the
  gradient from g to g-1 got lost in a crash race: g resends it (`Resume`).
* Forward pass not at the sink yet: the highest live holder with a stash is
  ordered to resend it onward (its next hop acknowledged, then died).

Backward pass, SWARM (the paper's baseline)
-------------------------------------------
Greedy next hop (the cheapest live next-stage peer, SWARM's "closest node"),
assuming every peer has `swarm_assumed_capacity` slots (SWARM assumes equal
memory: a peer that has less answers `MbDeny` after the transfer); resend
after a forward timeout (same deadline rule).  Relays do not report backward
trouble (`BackwardStuck` is GWTF's); the data node detects a failed backward
by its own timeouts (its hop deadline, its watchdog: `K_E2E` x the measured
end-to-end time) and restarts the microbatch: a new attempt, `Release` of the
old one everywhere, the whole pipeline recomputed from the embedding.  With
`cfg.act_on_gone`, a data node told by the membership layer (`peer_gone`)
that a holder of a microbatch in its backward pass is gone acts at once
(SWARM: restart; GWTF: a round) instead of waiting for its timeouts; a
microbatch whose forward was still on its way to the sink when the report came
is acted on when its loss is computed (SWARM: restarted instead of sending the
gradient down a path that cannot carry it).

Bounded rounds
--------------
At most `MAX_ROUNDS` rounds (GWTF) or restarts (SWARM) per microbatch and iteration, then the data node gives
the attempt up: `Release` to every holder, DEFERRED, pushed again next iteration.  A GWTF round that finds the
microbatch computing or queued at live nodes is a wait instead (`Rounds._waiting`, at most `MAX_WAITS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..effects import CancelTimer, Send, SetTimer
from ..messages import Probe, RepairOrder, Resume
from .records import BWD_STATES, FWD_STATES, MbTimer, RecoveryEffect, RelayPhase, Sink, Source, TimerKind

if TYPE_CHECKING:
    from .data import DataRecord
    from .node import RecoveryNode


@dataclass
class RoundState:
    """One microbatch's recovery rounds (held by its `DataRecord`, changed only here)."""

    count: int = 0  # rounds (GWTF) or restarts (SWARM) so far
    waits: int = 0  # GWTF rounds that found it computing or queued at live nodes (`Rounds._waiting`)
    collecting: bool = False  # probes out, answers awaited
    snapshot: dict[str, RelayPhase | None] = field(default_factory=dict)  # probe answers (None: a word unknown)


class Rounds:
    """A data node's recovery decisions (see the module docstring); its state is each record's `RoundState`."""

    def _sink_bk_timer(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """The last stage did not acknowledge the loss gradient in time."""
        if m.sink is Sink.GRAD:
            self.trouble(node, now, m, eff)

    def _watchdog(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        if m.sink is not Sink.FINAL and not m.round.collecting:
            self.trouble(node, now, m, eff)

    def _probes_due(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """The probe answers are in, or whoever did not answer is dead: decide."""
        if m.round.collecting:
            self._decide(node, now, m, eff)

    def answered(self, node: RecoveryNode, now: float, m: DataRecord, sender: str, state: RelayPhase | None,
                 eff: list[RecoveryEffect]) -> None:
        """`sender` answered (an `MbState`): while a round collects, its snapshot; every holder answered: decide."""
        rs: RoundState = m.round
        if rs.collecting:
            rs.snapshot[sender] = state
            wanted = {p for p in m.path if p is not None}
            if wanted <= set(rs.snapshot):
                eff.append(CancelTimer(MbTimer(TimerKind.PR, m.key)))
                self._decide(node, now, m, eff)

    def trouble(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """A microbatch is not progressing: GWTF runs a probe round, SWARM restarts it."""
        if m.sink is Sink.FINAL or m.src is Source.EMB:
            node.data.arm_watchdog(node, now, m, eff)
            return
        if node.swarm:
            self._restart(node, now, m, eff)
        else:
            self.round(node, now, m, eff)

    def round(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        rs: RoundState = m.round
        rs.count += 1
        if rs.count > node.cfg.max_rounds:
            node.data.give_up(node, now, m, eff)
            return
        node.stats.bump(probes=1)
        rs.collecting, rs.snapshot = True, {}
        for p in sorted({p for p in m.path if p is not None}):
            eff.append(Send(p, Probe(*m.key, tuple(x or "" for x in m.path), m.attempt)))
        eff.append(CancelTimer(MbTimer(TimerKind.WD, m.key)))
        eff.append(SetTimer(MbTimer(TimerKind.PR, m.key), now + node.cfg.probe_wait_s))

    def _decide(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """The recovery decision, from the probe answers (see the module doc)."""
        m.round.collecting = False
        node.data.arm_watchdog(node, now, m, eff)
        if self._judge(node, now, m, eff):
            self._waiting(node, now, m, eff)

    def _waiting(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """The round found the microbatch in the hands of live nodes, computing or queued behind others (busy is not
        dead): the round does not count toward `max_rounds`, it is a wait, and each wait arms a longer watchdog
        (the k-th: k + 1 times the usual); after `max_waits` waits the attempt is given up as after the rounds."""
        rs: RoundState = m.round
        rs.count -= 1
        rs.waits += 1
        if rs.waits > node.cfg.max_waits:
            node.data.give_up(node, now, m, eff)
            return
        node.data.arm_watchdog(node, now, m, eff, scale=1 + rs.waits)

    def _judge(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> bool:
        """The repairs the probe answers call for (see the module doc); True when there is none to make because
        the microbatch is computing or queued at a live node."""
        rs: RoundState = m.round
        S = node.nstages
        st = [rs.snapshot.get(p) if p is not None else None for p in m.path]
        a, key = m.attempt, m.key
        if m.sink is None:  # the forward has not reached the sink
            f = max((s for s in range(S) if st[s] in FWD_STATES), default=-1)
            if f < 0:
                if m.src is Source.SENT:
                    node.routing.presume_dead(node, m.next)
                    node.data.reroute(node, now, m, {m.next}, None, eff)
                return False
            if st[f] is RelayPhase.SENT:
                eff.append(Send(m.path[f], RepairOrder(*key, a, ())))
                return False
            return True  # held at stage f: computing, queued, or being sent on
        if m.sink in (Sink.LOSS, Sink.FINAL):
            return True  # computing here
        g = min((s for s in range(S) if st[s] in BWD_STATES), default=S)
        if any(st[s] in (RelayPhase.FWD, RelayPhase.SENDING) for s in range(g)):
            return True  # a repair is under way
        bad = [s for s in range(g) if st[s] is not RelayPhase.SENT]
        if not bad:
            if g < S and st[g] is RelayPhase.BWD:
                return True  # its backward computing, or queued, at stage g
            if g == S:
                if m.sink is Sink.GRAD:
                    return False  # my own hop deadline covers it
                node.data.resend_loss_grad(node, now, m, m.path[S - 1], eff)
            else:
                newprev = m.path[g - 1] if g > 0 else node.me
                eff.append(Send(m.path[g], Resume(*key, (newprev,), (), None, a)))
            return False
        self._repair_runs(node, now, m, bad, eff)
        return False

    def _repair_runs(self, node: RecoveryNode, now: float, m: DataRecord, bad: list[int],
                     eff: list[RecoveryEffect]) -> None:
        """Each run of bad stages is recomputed from the live holder before it (see the module doc)."""
        S, a, key = node.nstages, m.attempt, m.key
        runs: list[list[int]] = []
        for s in bad:
            if runs and runs[-1][-1] == s - 1:
                runs[-1].append(s)
            else:
                runs.append([s])
        for run in runs:
            lo, hi = run[0], run[-1]
            # resume at the holder after the run; if it died meanwhile, at the one after it (and so on)
            end = min([s for s in bad if s > hi] + [s for s in range(hi + 1, S) if m.path[s] is None] + [S])
            rest = ("",) * (hi - lo + 1) + tuple(m.path[hi + 1:end]) + ((node.me,) if end == S else ())
            if lo == 0:
                # the stage-0 holder failed it; `m.next` may instead be a relay a Recover was offered to, which
                # denied it (full, alive): presuming that one dead would leave no first hop to recover through
                hop = m.path[0] if m.path[0] is not None else m.next
                node.routing.presume_dead(node, hop)
                node.data.reroute(node, now, m, {hop} if hop is not None else set(), rest, eff)
            else:
                eff.append(Send(m.path[lo - 1], RepairOrder(*key, a, rest)))

    def _restart(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """SWARM: the whole pipeline again, from the embedding, as a new attempt."""
        rs: RoundState = m.round
        rs.count += 1
        if rs.count > node.cfg.max_rounds:
            node.data.give_up(node, now, m, eff)
            return
        node.stats.bump(restarts=1)
        rs.collecting, rs.snapshot = False, {}
        node.data.restart(node, now, m, eff)

    def give_up_stranded(self, node: RecoveryNode, now: float) -> list[RecoveryEffect]:
        """A data node whose first stage has no live relay left (every next peer gone or presumed dead): each
        microbatch of it in flight whose backward has not passed that stage cannot complete (no relay holds or
        can recompute its stage-0 activation), so it is given up now (deferred to a later iteration) rather
        than after `max_rounds` probe rounds that cannot succeed.  The driver calls it after a peer is gone."""
        eff: list[RecoveryEffect] = []
        peers = node.peers
        if not node.is_data or any(j not in peers.gone and j not in peers.dead for j in peers.next_peers):
            return eff
        records = node.data.records
        for m in [m for m in records.values() if m.sink is not Sink.FINAL]:
            if records.get(m.key) is m:
                node.data.give_up(node, now, m, eff)
        return eff


# A data node's timers of its rounds (its hop timer: data.DATA_TIMERS; a relay's: relay.RELAY_TIMERS).
ROUND_TIMERS = {
    TimerKind.BK: Rounds._sink_bk_timer,
    TimerKind.WD: Rounds._watchdog,
    TimerKind.PR: Rounds._probes_due,
}
