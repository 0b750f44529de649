"""The public types of the recovery machine and of the aggregation phase hold over whole simulated runs.

Every effect a machine returns is a member of its union (`RecoveryEffect`,
`PhaseEffect`), every timer key is the machine's own key type, never a
string to take apart, every phase and kind is an enum member, and what
crosses the wire (`MbState.state`) is the plain word.  The runs are the
simulator's, with churn, so repairs, probes, restarts and parking all happen.
"""

from __future__ import annotations

import typing

import pytest

from gwtf_node.protocol.effects import CancelTimer, Send, SetTimer
from gwtf_node.protocol.messages import IterationDone, MbState, PhaseKind
from gwtf_node.protocol.phases import PhaseEffect, Phases, PhaseTimer, Wait, WaitKind, WatchTimer
from gwtf_node.protocol.recovery import (
    Compute, ComputeKind, DataRecord, Key, MbTimer, RecoveryEffect, RecoveryNode, RelayPhase, RelayRecord, Sink,
    Source, TimerKind,
)
from gwtf_node.sim import train as T
from gwtf_node.sim.train import driver
from gwtf_node.sim.train.options import TrainSimOptions

RECOVERY_TYPES = typing.get_args(RecoveryEffect)
PHASE_TYPES = typing.get_args(PhaseEffect)
RECORD_PHASES = {RelayPhase.FWD, RelayPhase.SENDING, RelayPhase.SENT, RelayPhase.BWD, RelayPhase.GRAD,
                 RelayPhase.DONE}


def _check_recovery(node: RecoveryNode, eff: list, seen: dict) -> None:
    for e in eff:
        assert isinstance(e, RECOVERY_TYPES), f"{e!r} is not a RecoveryEffect"
        seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1
        if isinstance(e, (SetTimer, CancelTimer)):
            assert type(e.key) is MbTimer and type(e.key.kind) is TimerKind and type(e.key.key) is Key, e
        elif isinstance(e, Compute):
            assert type(e.kind) is ComputeKind and type(e.key) is Key, e
        elif isinstance(e, Send) and isinstance(e.msg, MbState):
            assert type(e.msg.state) is str and RelayPhase.parse(e.msg.state) is not None, e  # the wire word
    for k, r in node.mbs.items():
        assert type(k) is Key and r.key == k
        if isinstance(r, RelayRecord):
            assert r.phase in RECORD_PHASES and type(r.phase) is RelayPhase, r
        else:
            assert isinstance(r, DataRecord) and type(r.src) is Source, r
            assert r.sink is None or type(r.sink) is Sink, r
            assert all(v is None or type(v) is RelayPhase for v in r.round.snapshot.values()), r


def _check_phase(ph: Phases, eff: list, seen: dict) -> None:
    for e in eff:
        assert isinstance(e, PHASE_TYPES), f"{e!r} is not a PhaseEffect"
        seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1
        if isinstance(e, (SetTimer, CancelTimer)):
            assert type(e.key) in (PhaseTimer, WatchTimer), e
            if type(e.key) is PhaseTimer:
                assert type(e.key.kind) is PhaseKind, e


def _checked(cls, check, seen: dict):
    """`cls` with every public method that returns effects checked after each call."""
    def wrap(name):
        fn = getattr(cls, name)

        def method(self, *args, **kwargs):
            out = fn(self, *args, **kwargs)
            check(self, out[0] if isinstance(out, tuple) else out, seen)
            return out
        return method
    names = [n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))
             and (n.startswith("on_") or n in ("start", "open_iteration", "begin_aggregation", "aggregation_done",
                                                "set_flows", "set_neighbours", "peer_alive", "peer_gone", "peer_back",
                                                "give_up_stranded", "report_done", "set_leader", "maybe_begin",
                                                "resynced", "forget", "check_waits"))]
    return type(f"Checked{cls.__name__}", (cls,), {n: wrap(n) for n in names})


@pytest.mark.parametrize("policy", ["gwtf", "swarm"])
def test_every_effect_and_state_is_of_its_machines_types(policy: str, monkeypatch) -> None:
    seen_rec: dict = {}
    seen_phase: dict = {}
    monkeypatch.setattr(driver, "Phases", _checked(Phases, _check_phase, seen_phase))
    s = T.make_setting("table2-homogeneous", 1)
    sim_class = type("CheckedTrainSim", (T.TrainSim,), {"machine_class": _checked(RecoveryNode, _check_recovery,
                                                                                    seen_rec)})
    sim = sim_class(s, TrainSimOptions(policy=policy, churn=0.1, seed=1))
    sim.run(3)
    rep = sim.report(3)
    assert rep["lost_microbatches"] == 0
    # the runs exercised what is checked (a check that sees nothing proves nothing)
    assert {"Send", "SetTimer", "CancelTimer", "Compute", "OpenIteration", "IterationSettled"} <= set(seen_rec)
    assert {"Send", "SetTimer", "CancelTimer", "StartStep", "OpenIteration"} <= set(seen_phase)


def test_phase_waits_are_wait_kinds_and_keep_their_words() -> None:
    d = Phases("d", -1, 1, wait_bound_s=5.0)
    d.set_leader(0.0, "L", front=[])
    d.report_done(1.0, IterationDone(3, 1, 2.0, 0, 0, (1,)))
    (w,) = d.waiting(2.0)
    assert w == Wait(WaitKind.BEGIN, 3, 1.0, ("L",)) and type(w.what) is WaitKind
    assert w.what.value == "begin" and f"{w.what}" == "begin" and str(w.what) == "begin"  # status.json, logs
    eff = d.on_timer(7.0, d.watch_at and WatchTimer())
    assert [type(e.key) for e in eff if isinstance(e, SetTimer)] == [PhaseTimer, WatchTimer], eff
    assert d.on_timer(8.0, "phase.done.3") == []  # a key of another machine: not this machine's timer
