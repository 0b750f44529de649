"""How the training simulator is built (gwtf_node/sim/train/): its options, its nodes, its typed events and its
one interpreter of effects."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gwtf_node.protocol.effects import SetTimer
from gwtf_node.protocol.recovery import Compute
from gwtf_node.sim import train as T
from gwtf_node.sim.train import events as E
from gwtf_node.sim.train.interpret import COMPONENTS, interpret


@pytest.mark.parametrize("bad", [{"routing": "best"}, {"priors": "guessed"}, {"joining": "teleport"},
                                 {"swarm_reacts_to": "rumours"}, {"can_take": "some"}, {"routing": "dtfm"},
                                 {"scheduler": object()}])
def test_options_refuse_what_they_cannot_run(bad: dict) -> None:
    with pytest.raises(ValueError):
        T.TrainSimOptions(**bad)


def test_options_are_frozen_and_resolve_once() -> None:
    o = T.TrainSimOptions(crash_plan=[(200.0, "s1r0"), (100.0, "s2r0")])
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.seed = 3  # type: ignore[misc]
    r = o.resolved()
    assert r.crash_plan == ((100.0, "s2r0"), (200.0, "s1r0"))
    assert r.machines and not r.reflow and r.lend  # the flow machines: no re-installed optimum, lending
    assert r.flow_options == T.FLOW_OPTIONS and r.resolved() == r
    oracle = T.TrainSimOptions(routing="oracle").resolved()
    assert not oracle.machines and oracle.reflow and not oracle.lend


def test_every_simulated_node_holds_its_machines() -> None:
    s = T.make_setting("table2-homogeneous", 0)
    sim = T.TrainSim(s, T.TrainSimOptions())
    assert sorted(sim.nodes) == sorted(list(s.data) + list(s.relays))
    for nid, n in sim.nodes.items():
        assert n.id == nid and n.rec.cfg.node_id == nid
        assert (n.leader is not None) == (nid in s.data)  # the election runs on the data nodes only


def test_an_effect_a_machine_may_not_return_is_an_error() -> None:
    s = T.make_setting("table2-homogeneous", 0)
    sim = T.TrainSim(s, T.TrainSimOptions())
    with pytest.raises(TypeError, match="election"):
        interpret(sim, "d0", "leader", [Compute("forward", ("d0", 0, 0))])
    interpret(sim, "d0", "leader", [SetTimer("hb", 5.0)])  # a timer is queued as the component's event
    assert sim.queue.pop(10.0) == E.MachineTimer("d0", ("leader", "hb"), 1)
    assert all(c.timer in (E.MachineTimer, E.JoinTimer, E.FlowTimer) for c in COMPONENTS.values())


def test_the_queue_keeps_time_then_push_order() -> None:
    q = E.EventQueue()
    q.push(2.0, E.Gone("a"))
    q.push(1.0, E.Gone("b"))
    q.push(1.0, E.Gone("c"))
    assert [q.pop(10.0), q.pop(10.0)] == [E.Gone("b"), E.Gone("c")] and q.now == 1.0
    assert q.pop(1.5) is None and q.now == 1.0  # past the limit: the clock stays


def test_the_same_options_run_the_same_run() -> None:
    s1, s2 = T.make_setting("table2-heterogeneous", 2), T.make_setting("table2-heterogeneous", 2)
    a = T.TrainSim(s1, T.TrainSimOptions(churn=0.2, seed=2))
    b = T.TrainSim(s2, T.TrainSimOptions(churn=0.2, seed=2))
    a.run(2)
    b.run(2)
    assert json.dumps(a.report(2), sort_keys=True, default=str) == json.dumps(b.report(2), sort_keys=True, default=str)
    assert a.events == b.events > 0
