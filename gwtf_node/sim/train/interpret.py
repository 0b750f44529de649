"""The training simulator's driver of the protocol machines (`protocol/driver.py`): what every machine of a
simulated node returns (send this message, set or cancel this timer, start this computation, ...) is carried
out through one `SimDriver` per (node, machine), as the daemon's components carry out theirs through
`runtime/node/driver.py`.

`COMPONENTS` names each machine of a node: the event its timers fire as, the `TrainSim` method that puts its
messages on the wire, whether it computes, and the `TrainSim` method that carries out each effect only that
machine returns (None: nothing to do; an effect it does not name is an error, `UnknownEffect`).  Timers of the
node's machines share the node's versions, keyed (component, key); a flow machine keeps its own keys and
versions (`TrainSim._ftv`).  The simulator sends at once, in the order of the effects: it has nothing to
`flush`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...protocol.driver import UnknownEffect, carry_out
from ...protocol.effects import CancelTimer, Send, SetTimer, TimerKey
from ...protocol.phases import LeftOut, OpenIteration, OutOfStep, Overdue, StartStep
from ...protocol.recovery import Compute, IterationSettled
from .events import FlowTimer, JoinTimer, MachineTimer


@dataclass(frozen=True)
class Component:
    """One kind of machine of a simulated node (module docstring)."""

    what: str  # for the error that names an effect it may not return
    timer: type  # the event its timers fire as
    send: str = "_send"  # the TrainSim method that puts its messages on the wire
    computes: bool = False  # its `Compute` effects go to the node's compute queue
    effects: dict = field(default_factory=dict)  # its own effect type -> the TrainSim method for it (None: nothing)
    own_timers: bool = False  # its timer keys and versions are its own (a flow machine's)


COMPONENTS = {
    "rec": Component("microbatch machine", MachineTimer, computes=True, effects={
        OpenIteration: "_rec_opens", IterationSettled: "_report_settled"}),
    "phase": Component("aggregation phase", MachineTimer, effects={
        StartStep: "_phase_step", LeftOut: "_phase_step", OutOfStep: "_phase_step",
        OpenIteration: "_phase_opens",  # (or a pause while a stage is empty, churn.py)
        Overdue: None}),  # the daemon logs it; its resolution comes as the Sends beside it
    "leader": Component("election", MachineTimer),
    "joiner": Component("joiner machine", JoinTimer, send="_send_joiner"),
    "placement": Component("placement machine", JoinTimer),
    "flow": Component("flow machine", FlowTimer, send="_send_flow", own_timers=True),
}


class SimDriver:
    """The `protocol.driver.Driver` of machine `component` of node `nid` in the simulator `sim` (a `TrainSim`)."""

    def __init__(self, sim, nid: str, component: str) -> None:
        c = COMPONENTS[component]
        self.sim, self.nid, self.c = sim, nid, c
        self._send = getattr(sim, c.send)
        self._tkey = None if c.own_timers else component  # (the flow machine's keys are its own)
        self.own = {t: self._own(how) for t, how in c.effects.items()}
        self.what = f"{nid}'s {c.what}"

    def _own(self, how: str | None):
        if how is None:
            return lambda e: None
        method = getattr(self.sim, how)
        return lambda e: method(self.nid, e)

    def _versions(self) -> dict:
        return self.sim._ftv if self.c.own_timers else self.sim._tv

    def send(self, to: str, msg) -> None:
        self._send(self.nid, Send(to, msg))

    def set_timer(self, key: TimerKey, deadline: float) -> None:
        self.sim._timer(self._versions(), self.c.timer, self.nid, SetTimer(key, deadline), self._tkey)

    def cancel_timer(self, key: TimerKey) -> None:
        self.sim._timer(self._versions(), self.c.timer, self.nid, CancelTimer(key), self._tkey)

    def compute(self, e: Compute) -> None:
        if not self.c.computes:
            raise UnknownEffect(f"{self.what} returned {e!r}: it does not compute")
        self.sim._start_compute(self.nid, e)

    def flush(self) -> None:
        pass  # (sent at once, in order)


def interpret(sim, nid: str, component: str, effects: list) -> None:
    """Carry out the `effects` that `nid`'s machine `component` returned, in order, through its driver."""
    d = sim.drivers.get((nid, component))
    if d is None:
        d = sim.drivers[(nid, component)] = SimDriver(sim, nid, component)
    carry_out(d, effects, d.own, what=d.what)
