"""Scaled formation's run at a node: cost scaling (flow/scaling.py) to its end, then the handover.

`ScaledFormation` runs a node's machine to its end: at `ScaleDone` the
machine's flows become the flow machine's units (`FlowNode.adopt`), which
then starts and handles membership changes as after any formation.  One data
node only; it opens formation from what it knows (flow/scaling.py `leading`,
`machine_for`).
A neighbour that leaves during formation would keep its credit (the phase
would never end) and its flows: the node that loses it, and does not hear it
again within `LEFT_GRACE_S` (a false death), tells the data node
(`ScaleAbort`), which tells every node, and each hands over with no units:
the flow machines form the flows from nothing with label waves.  A node that
hears nothing of formation for `GIVE_UP_S` (the data node left) does the
same, and the data node calls it off when it hears nothing for `STALL_S`
(credit lost with a node it cannot see).  A relay that gets a flow message
before a first phase hands over with no units at once (`flow_message`: its
neighbours form their flows without scaled formation).  A lost message is sent again
(`Resender`, flow/resend.py: numbered messages, gaps asked for, probes after
a silence), and a duplicate is taken once.  A node that joins during
formation is not part of it and joins the flows after the handover.  `ScaledNode` hosts formation and flow machine in
the simulator (sim/flowsim.py `run_gwtf(formation="scaling")`,
sim/flowchurn.py, scripts/bench_flow_scale.py `--formation`), holding the
flow messages that come before the handover; the daemon's is
runtime/node/scaledformation.py (`join --scaled-formation`).  Pure: the
driver hands in `now`.
"""

from __future__ import annotations

import math

from ..effects import Effect, Send, SetTimer
from ..scalemsgs import SCALE_MESSAGES, ScaleAbort, ScaleCredit, ScaleDone, ScaleNack, ScalePhase, ScaleProbe, ScalePush
from .node import FlowNode
from .resend import DATA_PROBE_S, PROBE_DOUBLINGS, QUIET_FACTOR, Resender
from .scaling import ScalingMachine, node_of

MAX_HELD = 4096  # flow messages held before handover; more are dropped (counted in `ScaledNode.dropped`)
GIVE_UP_S = 900.0  # a node that hears nothing of formation this long hands over with no units (the data node left)
PROBES_BEFORE_STALL = 10  # the data node probes at least this often before a stall calls formation off
STALL_S = 600.0  # the data node that hears nothing this long calls formation off (credit lost: a message, a node)
GIVE_UP = ("scaling", "give up")  # the formation's timer key (the flow machine's are strings)
LEFT_GRACE_S = 60.0  # a neighbour presumed dead that is back within this long does not call formation off
FORMED, ABORTED = "formed", "aborted"  # how a scaled formation ended (`ScaledFormation.over`)


class ScaledFormation:
    """A node's scaled formation with its end (module doc): the machine, the messages held until the first
    `ScalePhase` says how costs scale, the call to abort and the give-up deadline; its messages numbered, each
    taken once, a lost one sent again (`Resender`, flow/resend.py).  `over` is None while it runs, then "formed"
    or "aborted"; `units()` are then what the flow machine adopts."""

    def __init__(self, scaling: ScalingMachine) -> None:
        self.scaling = scaling
        self.over: str | None = None
        self.why = ""
        self.early: list = []  # (sender, message) that came before the first ScalePhase
        self.heard = 0.0  # the time of the last new formation message
        self.probes = 0  # probes sent since then
        self.quiet = 0.0  # the longest silence that ended without a probe
        self.took = False  # a relay: took something new since the data node's last probe
        self.working = 0.0  # the data node: when a relay last said it took something new (`_probed`)
        self.probe_at = 0.0  # when it probes next
        self.over_at = 0.0  # when formation ended here
        self.resend = Resender()
        self.linked = {node_of(v) for _, v in scaling.given} - {scaling.id}  # the nodes at its arcs' other ends
        self.gone: dict[str, float] = {}  # neighbour presumed dead -> when formation is off unless it is back

    @property
    def limit_s(self) -> float:
        return STALL_S if self.lead else GIVE_UP_S

    @property
    def lead(self) -> bool:
        return self.scaling.id == self.scaling.data

    def _probe_after(self, now: float) -> None:
        """The data node's next probe (flow/resend.py), if nothing new comes before: after `DATA_PROBE_S`, or
        `QUIET_FACTOR` x the longest silence that ended without one (formation's own pace) if longer; the interval
        doubles, up to a `PROBES_BEFORE_STALL`th of `STALL_S`."""
        wait = max(DATA_PROBE_S, QUIET_FACTOR * self.quiet) * 2 ** min(self.probes, PROBE_DOUBLINGS)
        self.probe_at = now + min(wait, STALL_S / PROBES_BEFORE_STALL) if self.lead else math.inf

    def start(self, now: float) -> list[Effect]:
        self.heard = now
        self._hear(now)
        eff = self.resend.number(self._check(now, self.scaling.start(now)))
        return eff + [self._wake()]

    def _wake(self) -> SetTimer:
        """The formation's timer while it runs: the next probe, the stall or give-up limit, a neighbour's grace."""
        return SetTimer(GIVE_UP, min(self.probe_at, max(self.heard, self.working) + self.limit_s,
                                     *self.gone.values()))

    def on_timer(self, now: float) -> list[Effect]:
        sc = self.scaling
        if self.over is not None:
            return self._confirm(now)
        left = sorted(p for p, t in self.gone.items() if t <= now)
        if left:
            eff = self._left(now, left[0])
        elif now - max(self.heard, self.working) >= self.limit_s:
            eff = self.resend.number(self._abort(
                now, f"nothing heard of formation for {self.limit_s:g} s (phase {sc.phase}, "
                     f"{1 - sc.returned if self.lead else sc.credit} of its credit away)", False))
        else:
            return self._probe(now, sc.peers) + [self._wake()]
        return eff + ([SetTimer(GIVE_UP, self.probe_at)] if self.lead else [])

    def _probe(self, now: float, to) -> list[Effect]:
        """The data node's probe of `to`, if it is due (flow/resend.py)."""
        if now < self.probe_at:
            return []
        self.probes += 1
        self._probe_after(now)
        return self.resend.probe(to, self.scaling.phase)

    def _confirm(self, now: float) -> list[Effect]:
        """Formation over, the data node probes every node that has not acknowledged its end (`ScaleDone`,
        `ScaleAbort`: each node answers it) until it does, for at most `GIVE_UP_S`."""
        waiting = self.resend.unacked(self.scaling.peers)
        if not self.lead or not waiting or now - self.over_at >= GIVE_UP_S:
            return []
        eff = self._probe(now, waiting)
        return eff + [SetTimer(GIVE_UP, self.probe_at)]

    def on_message(self, now: float, sender: str, msg) -> list[Effect]:
        """A formation message: a numbered one taken once (`Resender.take`); held until the first `ScalePhase`
        says how costs scale; one that does not fit this node (`ScalingMachine.fits`) is counted and dropped, but
        a push over a link this node does not have is declined (`ScalingMachine.decline`: its credit goes on).
        Asked for its messages again (`ScaleNack`, `ScaleProbe`), it sends them, also once it is over."""
        sc = self.scaling
        if isinstance(msg, ScaleNack):
            return self.resend.nacked(sender, msg)
        if isinstance(msg, ScaleProbe):
            return self._probed(now, sender, msg)
        eff: list[Effect] = []
        if getattr(msg, "seq", 0):
            new, eff = self.resend.take(now, sender, msg.seq, msg.ack)
            if not new:
                return eff
            self.took = True
        if self.over is not None:
            return []  # (formation is over: nothing of it can change the flows now)
        if sc.alpha is None and not isinstance(msg, (ScalePhase, ScaleDone, ScaleAbort)):
            if len(self.early) < MAX_HELD:
                self.early.append((sender, msg))
            else:
                sc.ignored += 1
            return eff
        first = sc.alpha is None
        eff += self._take(now, sender, msg)
        if isinstance(msg, ScalePhase) and self.early:
            early, self.early = self.early, []
            for s, m in early:
                eff += self._take(now, s, m)
        if first and self.gone:  # neighbours presumed dead before formation reached this node: their grace starts
            self.gone = dict.fromkeys(self.gone, now + LEFT_GRACE_S)
            eff.append(self._wake())
        return self.resend.number(self._check(now, eff))

    def _probed(self, now: float, sender: str, probe: ScaleProbe) -> list[Effect]:
        """A probe (flow/resend.py).  The data node's tells a relay the data node is there (it gives up only when it
        is not, `GIVE_UP_S`), and a relay that took something new since the last one answers it: work goes on
        where the data node cannot see it (a long chain of pushes, each loss in it waiting for a probe), and the
        data node does not call formation off while it does."""
        sc, eff = self.scaling, self.resend.probed(now, sender, probe, self.scaling.data, self.scaling.id)
        if sender == sc.data and not self.lead:
            self.heard = now
            if self.took and self.over is None:
                eff = eff + [Send(sc.data, ScaleProbe(sc.phase, len(self.resend.sent.get(sc.data, ()))))]
            self.took = False
        elif self.lead:
            self.working = now
        return eff

    def _take(self, now: float, sender: str, msg) -> list[Effect]:
        sc = self.scaling
        if not sc.fits(sender, msg):
            if isinstance(msg, ScalePush) and msg.amount > 0 and self.over is None:
                self._hear(now)
                return sc.decline(now, sender, msg)
            sc.ignored += 1
            return []
        self._hear(now)
        if sc.id == sc.data and sender not in sc.peers:
            sc.peers += (sender,)  # a node it did not know of takes part: it hears of the next phases and the end
        if isinstance(msg, ScaleAbort) and self.lead:  # a relay saw a neighbour leave: every node is told
            return self._abort(now, f"{sender}: {msg.reason}", False)
        if isinstance(msg, (ScaleDone, ScaleAbort)) and not self.lead:  # acknowledged (`_confirm`)
            end = self._abort(now, msg.reason, False) if isinstance(msg, ScaleAbort) else sc.on_message(now, sender, msg)
            return end + [Send(sc.data, ScaleCredit("0"))]
        if isinstance(msg, ScalePhase) and sc.alpha is None:
            sc.scale(msg.alpha)
        return sc.on_message(now, sender, msg)

    def _hear(self, now: float) -> None:
        if not self.probes:
            self.quiet = max(self.quiet, now - self.heard)
        self.heard, self.probes = now, 0
        self._probe_after(now)

    def flow_message(self, now: float, sender: str) -> list[Effect]:
        """A flow message from `sender` (no formation message) came: a relay that has not heard a first phase takes
        it that the data node forms its flows without scaled formation (several data nodes, or none of it there),
        and hands over with no units at once instead of waiting for a first phase until `GIVE_UP_S`."""
        if self.over is not None or self.lead or self.scaling.alpha is not None:
            return []
        self.early = []
        return self._abort(now, f"{sender} forms its flows without scaled formation", False)

    def late(self, now: float, peer: str) -> list[Effect]:
        """The data node hears of `peer` after its formation is over, and `peer` was not part of it: it tells it so
        (`ScaleAbort`, probed for until acknowledged), and `peer` starts its flow machine with no units instead of
        waiting for a first phase until `GIVE_UP_S`."""
        sc = self.scaling
        if not self.lead or self.over is None or peer in sc.peers or peer == sc.id:
            return []
        sc.peers += (peer,)
        self.probes = 0
        self._probe_after(now)
        reason = "formation was over before this node took part"
        return self.resend.number([Send(peer, ScaleAbort(reason))]) + [SetTimer(GIVE_UP, self.probe_at)]

    def neighbour_left(self, now: float, peer: str, presumed: bool = True) -> list[Effect]:
        """`peer` crashed (`presumed` dead) or left: formation is called off if it is at the other end of one of
        this node's arcs (its credit and its flows are lost); a crashed one that is back within `LEFT_GRACE_S` (a
        false death on a busy host: what was lost meanwhile is sent again, flow/resend.py) does not call it off.
        A relay's grace starts at its first phase: before, nothing of formation has passed (a data node busy
        measuring 54 links at the opening was presumed dead by its relays for 60 s)."""
        if self.over is not None or peer not in self.linked:
            return []
        if not presumed:
            return self._left(now, peer)
        self.gone.setdefault(peer, now + LEFT_GRACE_S if self.scaling.alpha is not None else math.inf)
        return [self._wake()]

    def _left(self, now: float, peer: str) -> list[Effect]:
        """Neighbour `peer` is gone for good: formation is off, and the data node hears why."""
        return self.resend.number(self._abort(now, f"{peer} left during formation", True))

    def neighbour_back(self, peer: str) -> None:
        """`peer`, presumed dead, is back (its Hello): its leaving no longer calls formation off."""
        self.gone.pop(peer, None)

    def units(self) -> tuple[dict, dict]:
        return self.scaling.units() if self.over == FORMED else ({}, {})

    def _check(self, now: float, eff: list[Effect]) -> list[Effect]:
        if self.over is None and self.scaling.done is not None:
            self._end(now, FORMED)
        return eff

    def _end(self, now: float, how: str) -> None:
        self.over, self.over_at, self.probes = how, now, 0
        self._probe_after(now)

    def _abort(self, now: float, reason: str, seen: bool) -> list[Effect]:
        """Formation is off: the data node tells every node, a relay that saw why (`seen`) tells the data node."""
        sc = self.scaling
        self.why = reason
        self._end(now, ABORTED)
        if sc.id == sc.data:
            return [Send(p, ScaleAbort(reason)) for p in sc.peers]
        return [Send(sc.data, ScaleAbort(reason))] if seen else []


class ScaledNode:
    """A node's flow machine behind its scaled formation (module doc): the simulator's machine for the node, with
    the flow machine's membership calls."""

    def __init__(self, flow: FlowNode, scaling: ScalingMachine) -> None:
        self.flow, self.formation = flow, ScaledFormation(scaling)
        self.handed: float | None = None  # the time the flows (or none, when aborted) went to the flow machine
        self.held: list = []  # (sender, flow message) that came before
        self.dropped = 0

    @property
    def scaling(self) -> ScalingMachine:
        return self.formation.scaling

    @property
    def aborted(self) -> bool:
        return self.formation.over == ABORTED

    def start(self, now: float) -> list[Effect]:
        return self._after(now, self.formation.start(now))

    def on_timer(self, now: float, key) -> list[Effect]:
        if key == GIVE_UP:
            return self._after(now, self.formation.on_timer(now))
        return self.flow.on_timer(now, key) if self.handed is not None else []

    def on_message(self, now: float, sender: str, msg) -> list[Effect]:
        if isinstance(msg, SCALE_MESSAGES):
            return self._after(now, self.formation.on_message(now, sender, msg))
        if self.handed is not None:
            return self.flow.on_message(now, sender, msg)
        if len(self.held) < MAX_HELD:
            self.held.append((sender, msg))
        else:
            self.dropped += 1
        return self._after(now, self.formation.flow_message(now, sender))

    def add_neighbour(self, now: float, peer: str, cost: float, side: str) -> list[Effect]:
        self.formation.neighbour_back(peer)
        return self.flow.add_neighbour(now, peer, cost, side)

    def remove_neighbour(self, now: float, peer: str) -> list[Effect]:
        eff = self.flow.remove_neighbour(now, peer)
        return eff + self._after(now, self.formation.neighbour_left(now, peer))

    def _after(self, now: float, eff: list[Effect]) -> list[Effect]:
        """`eff`, and the handover once formation is over: the flow machine adopts its units and starts, and
        takes the flow messages held."""
        if self.formation.over is None or self.handed is not None:
            return eff
        self.handed = now
        self.flow.adopt(*self.formation.units())
        eff = eff + self.flow.start(now)
        held, self.held = self.held, []
        for sender, msg in held:
            eff += self.flow.on_message(now, sender, msg)
        return eff
