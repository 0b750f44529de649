"""Scaled formation in the daemon: the cost-scaling machine of `protocol/flow/scaling.py` this node hosts before its
flow machine, its frames, and the handover.

With `--scaled-formation`, or auto's choice (protocol/neighbourhood.py: at
least 10 relays a stage), and one data node, a node that forms its flows at
the start of a run (not one the leader placed later) runs scaled formation
first, over the links `Flows.form` measured: their costs in whole
`COST_QUANTUM_MS` (cost scaling takes integers), each link's capacity the
smaller of its ends' (the peers' Hellos).  The data node opens it with every
peer it knows of (`machine_for`); the others learn how costs scale from its
first `ScalePhase`.  Its messages travel as frames of their own (codec.py,
value bounds in bounds.py), through an `Outbox` (driver.py: in order per
peer); a message that names no arc of this node, or comes from a node that
may not send it, is dropped and counted (`ScalingMachine.ignored`).

The node hands over when formation is over (`ScaledFormation.over`): with the
units it formed (`ScaleDone`), or with none when it was called off (a
neighbour left: `ScaleAbort`; the data node heard nothing of it for
`STALL_S`) or nothing of it came for `GIVE_UP_S`; `Flows` then starts the
flow machine holding them, and the flow messages that waited for it are
replayed.  A frame lost in flight (a libp2p connection reset) is asked for
again and sent again (protocol/flow/resend.py: numbered frames, gaps and
probes), also after this node's formation is over; `GWTF_DROP_SCALE` (faults.py)
loses frames on purpose.  The data node tells a node it hears of after
formation began, and that was not part of it, that formation is over
(`ScaledFormation.late`): it starts its flow machine at once.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from ...protocol.effects import Send
from ...protocol.scalemsgs import ScaleNack, ScaleProbe
from ...protocol.flow.scaled import ABORTED, ScaledFormation
from ...protocol.flow.scaling import ScalingMachine
from ..net.wire import Wire, now
from .driver import Drivers, Owner
from .faults import Faults

log = logging.getLogger("gwtf.node")

WHOLE_ROUNDS = 4  # rounds of measuring the links of peers heard of while the links were measured


async def measure_whole(measure: Callable[[str, bool], Awaitable[None]], me: str, nxt: list[str], prv: list[str],
                        known: tuple[Callable[[], list[str]], Callable[[], list[str]]] | None
                        ) -> tuple[list[str], list[str]]:
    """Measure the links to `nxt` and `prv` (`measure(peer, next_side)`); with `known` (the next- and
    previous-stage peers known now: scaled formation, whose arcs are those of its opening), then the links of
    the peers heard of meanwhile, until none is new (at most WHOLE_ROUNDS rounds).  A peer whose Hello came while
    the links were measured is then an arc of formation, not a link the flow machines add after it: on 55
    daemons the data node opened formation with 5 of its 6 last-stage relays measured."""
    nxt, prv = list(nxt), list(prv)
    todo = sorted(set(nxt) | set(prv))
    for r in range(WHOLE_ROUNDS):
        for pid in todo:
            await measure(pid, pid in nxt and pid != me)
        if known is None or r == WHOLE_ROUNDS - 1:
            break  # (one heard of later is added by the flow machines, as after formation)
        new = [p for p in known[0]() if p not in nxt], [p for p in known[1]() if p not in prv]
        if not new[0] and not new[1]:
            break
        log.info("scaled formation: %d peers heard of while the links were measured: measuring them too",
                 len(set(new[0]) | set(new[1])))
        nxt, prv = nxt + new[0], prv + new[1]
        todo = sorted(set(new[0]) | set(new[1]))
    return nxt, prv


class Scaling:
    """This node's scaled formation, driven (module doc); `on_done(inn, out)` is called once it is over."""

    def __init__(self, wire: Wire, drivers: Drivers, machine: ScalingMachine,
                 on_done: Callable[[dict, dict], None], faults: Faults | None = None) -> None:
        self.formation = ScaledFormation(machine)
        self.faults = faults or Faults()
        self.on_done = on_done
        self.driver = drivers.make(Owner.SCALING, self._on_timer, in_order=wire.send_in_order, fifo=True)
        self.done = False
        self.phase = 0  # the data node: the last phase it logged

    @property
    def machine(self) -> ScalingMachine:
        return self.formation.scaling

    def start(self) -> None:
        lead = self.machine.id == self.machine.data
        log.info("scaled formation: %s", f"opening it with {len(self.machine.peers)} nodes (cost factor "
                 f"{self.machine.alpha}, first epsilon {self.machine.eps})" if lead else "waiting for its first phase")
        self._carry(self.formation.start(now()))

    def on_message(self, peer: str, msg: Any) -> None:
        """A frame of formation; after it is over, one asking for frames again is answered, the others ignored."""
        self._carry(self.formation.on_message(now(), peer, msg))

    def hello(self, peer: str) -> None:
        """A peer's Hello: a neighbour presumed dead that is back does not call formation off
        (`ScaledFormation.neighbour_back`); once formation is over, the data node tells one that was not part of it
        (`ScaledFormation.late`; the flow machine's start replays every peer's Hello, those heard of meanwhile too)."""
        self.formation.neighbour_back(peer)
        if not self.done:
            return
        eff = self.formation.late(now(), peer)
        if eff:
            log.info("scaled formation: %s came after it was over: told to start its flow machine", peer[:16])
            self._carry(eff)

    def flow_message(self, peer: str) -> None:
        """A flow message came before the flow machine started (`ScaledFormation.flow_message`)."""
        if not self.done:
            self._carry(self.formation.flow_message(now(), peer))

    def peer_gone(self, peer: str, presumed: bool) -> None:
        """A peer crashed (`presumed` dead) or left: formation is called off if it was a neighbour, a crashed one
        not back within a grace (`ScaledFormation.neighbour_left`)."""
        if not self.done:
            self._carry(self.formation.neighbour_left(now(), peer, presumed))

    def _on_timer(self, key: Any) -> None:
        if not self.done:
            self._carry(self.formation.on_timer(now()))

    def _carry(self, effects: list) -> None:
        probes = sum(isinstance(e, Send) and isinstance(e.msg, ScaleProbe) for e in effects)
        if probes:
            log.info("scaled formation: nothing new for %.1f s (phase %d): %d nodes probed for frames lost",
                     now() - self.formation.heard, self.machine.phase, probes)
        for e in effects:
            if isinstance(e, Send) and isinstance(e.msg, ScaleNack) and e.msg.seqs:  # (none: a duplicate's ack)
                log.info("scaled formation: frames %s from %s lost: asked for again", list(e.msg.seqs)[:8], e.to[:16])
        self.driver.carry([e for e in effects if not (isinstance(e, Send) and self.faults.lose_scale(e.to, e.msg))])
        self.driver.flush()
        m = self.machine
        if m.id == m.data and m.phase != self.phase and m.done is None and self.formation.over is None:
            self.phase = m.phase
            log.info("scaled formation: phase %d (epsilon %d)", m.phase, m.eps)
        if self.done or self.formation.over is None:
            return
        self.done = True
        inn, out = self.formation.units()
        if self.formation.over == ABORTED:
            log.warning("scaled formation called off (%s; here: phase %d, %s credit held, %d messages held "
                        "for the first phase, %d ignored): the flow machine forms the flows from nothing",
                        self.formation.why, self.machine.phase, self.machine.credit, len(self.formation.early),
                        self.machine.ignored)
        else:
            log.info("scaled formation over after %d phases: %d units in, %d out here (%d messages ignored)",
                     self.machine.phase, sum(inn.get(self.machine.data, {}).values()),
                     sum(out.get(self.machine.data, {}).values()), self.machine.ignored)
        self.on_done(inn, out)
