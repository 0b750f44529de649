"""The training simulator's one interpreter of effects: what every machine of a simulated node returns (send
this message, set or cancel this timer, start this computation, ...) is carried out here, as the daemon's
node carries out its components' effects in one place.

`COMPONENTS` names each machine of a node, the event its timers fire as, and the `TrainSim` method that
carries out each effect it may return besides its timers (None: nothing to do; an effect it does not name is
an error).  Timers of the node's machines share the node's versions, keyed (component, key); a flow machine
keeps its own keys and versions (`TrainSim._ftv`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...protocol.effects import CancelTimer, Send, SetTimer
from ...protocol.phases import LeftOut, OpenIteration, OutOfStep, Overdue, StartStep
from ...protocol.recovery import Compute, IterationSettled
from .events import FlowTimer, JoinTimer, MachineTimer


@dataclass(frozen=True)
class Component:
    """One kind of machine of a simulated node (module docstring)."""

    what: str  # for the error that names an effect it may not return
    timer: type  # the event its timers fire as
    effects: dict = field(default_factory=dict)  # effect type -> the TrainSim method for it (None: nothing)
    own_timers: bool = False  # its timer keys and versions are its own (a flow machine's)


COMPONENTS = {
    "rec": Component("microbatch machine", MachineTimer, {
        Send: "_send", Compute: "_start_compute", OpenIteration: "_rec_opens", IterationSettled: "_report_settled"}),
    "phase": Component("aggregation phase", MachineTimer, {
        Send: "_send", StartStep: "_phase_step", LeftOut: "_phase_step", OutOfStep: "_phase_step",
        OpenIteration: "_phase_opens",  # (or a pause while a stage is empty, churn.py)
        Overdue: None}),  # the daemon logs it; its resolution comes as the Sends beside it
    "leader": Component("election", MachineTimer, {Send: "_send"}),
    "joiner": Component("joiner machine", JoinTimer, {Send: "_send_joiner"}),
    "placement": Component("placement machine", JoinTimer, {Send: "_send"}),
    "flow": Component("flow machine", FlowTimer, {Send: "_send_flow"}, own_timers=True),
}


def interpret(sim, nid: str, component: str, effects: list) -> None:
    """Carry out the `effects` that `nid`'s machine `component` returned, in order."""
    c = COMPONENTS[component]
    for e in effects:
        t = type(e)
        if t is SetTimer or t is CancelTimer:
            if c.own_timers:
                sim._timer(sim._ftv, c.timer, nid, e)
            else:
                sim._timer(sim._tv, c.timer, nid, e, component)
            continue
        if t not in c.effects:
            raise TypeError(f"unknown effect {e!r} from {nid}'s {c.what}")
        how = c.effects[t]
        if how is not None:
            getattr(sim, how)(nid, e)
