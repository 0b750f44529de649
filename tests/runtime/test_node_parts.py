"""The daemon's plumbing without a network: the message table, the effect interpreter, timers, tensor store, peers."""

from __future__ import annotations

import typing
from types import SimpleNamespace
from unittest.mock import Mock

import pytest
import trio
import trio.testing

from gwtf_node.protocol import messages as m
from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.protocol.driver import UnknownEffect
from gwtf_node.protocol.recovery import Compute, ComputeKind
from gwtf_node.runtime.node.driver import Drivers, Owner, Timers
from gwtf_node.runtime.node.node import Admit, routes
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place
from gwtf_node.runtime.node.tensorstore import Drop, Keep, Slot, TensorStore

NOT_RECEIVED = {m.ProbeAck}  # on the wire format, sent by no machine: refused as unexpected
# pooled formation's homing messages travel inside a PoolFrame only (pooling.py): a bare one is refused as unexpected
NOT_RECEIVED |= {m.HomingStart, m.TraceUnit, m.CostQuery, m.CostReply, m.Install}


def _parts() -> SimpleNamespace:
    names = ("discovery", "liveness", "flows", "microbatches", "aggregation", "leadership", "joining", "bootstrap",
             "spread")
    return SimpleNamespace(**{n: Mock(name=n) for n in names})


def test_every_message_type_has_one_route() -> None:
    table = routes(_parts())
    every = set(typing.get_args(m.Message))
    assert set(table) == every - NOT_RECEIVED, sorted(t.__name__ for t in every ^ set(table))
    # only what must work before (or without) a Hello is taken from a peer that has not said one
    open_types = {t for t, r in table.items() if r.admit is not Admit.KNOWN}
    assert open_types == {m.Hello, m.PeerList, m.Revocations, m.Ping, m.Pong, m.LinkCost, m.Refused}
    # a frame with a tensor goes to a handler that takes the payload
    assert {t for t, r in table.items() if r.payload} == {
        m.Forward, m.Backward, m.Complete, m.MbDeny, m.Probe, m.Recover, m.Resume, m.BackwardStuck, m.Room,
        m.Release, m.MbState, m.RepairOrder, m.Lend, m.AllReduceChunk, m.StageState, m.LinkProbe}


class _Wire:
    """What a driver uses of the wire: tasks started, in order."""

    def __init__(self) -> None:
        self.spawned: list[tuple] = []

    def spawn(self, fn, *args) -> None:
        self.spawned.append((fn, *args))

    async def send(self, peer, msg) -> bool:
        return True


def test_an_effect_no_component_handles_is_refused_loudly() -> None:
    wire = _Wire()
    drivers = Drivers(wire)
    flows = drivers.make(Owner.FLOWS, lambda key: None)

    class Strange:
        pass

    with pytest.raises(UnknownEffect, match="flows machine returned"):
        flows.carry([SetTimer("tick", 1.0), Strange()])
    assert drivers.timers.deadlines == {(Owner.FLOWS, "tick"): 1.0}  # what came before it was done
    with pytest.raises(UnknownEffect, match="it has no worker"):  # only the microbatches' driver computes
        flows.carry([Compute(ComputeKind.FORWARD, ("d", 0, 0))])
    with pytest.raises(UnknownEffect, match="no component handles it"):
        drivers.fire(Owner.AGGREGATION, "x")


def test_a_component_carries_out_its_own_effects_in_order() -> None:
    """Sends to one peer leave in one task, in order, after the batch; the component's own effects and its
    computations are carried out where they stand; a due timer goes back to the component that set it."""
    wire, seen, fired = _Wire(), [], []

    async def in_order(peer, msgs) -> None:
        pass

    async def work(e) -> None:
        pass

    drivers = Drivers(wire)
    mb = drivers.make(Owner.MICROBATCHES, fired.append, in_order=in_order, compute=work)
    c = Compute(ComputeKind.FORWARD, ("d", 0, 0))
    mb.carry([Send("a", 1), Send("b", 2), c, Send("a", 3), Strange2()], {Strange2: seen.append})
    assert [type(x).__name__ for x in seen] == ["Strange2"]
    assert wire.spawned == [(work, c), (in_order, "a", [1, 3]), (in_order, "b", [2])]
    drivers.fire(Owner.MICROBATCHES, "tick")
    assert fired == ["tick"]


class Strange2:
    pass


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.mark.trio
async def test_timers_fire_in_deadline_order_keyed_by_component(autojump_clock) -> None:
    fired: list[tuple[Owner, str]] = []
    timers = Timers(lambda owner, key: fired.append((owner, key)))
    async with trio.open_nursery() as n:
        n.start_soon(timers.loop)
        t0 = trio.current_time()
        timers.set((Owner.FLOWS, "tick"), t0 + 3)
        timers.set((Owner.MICROBATCHES, "tick"), t0 + 1)  # same key, another component: another timer
        timers.set((Owner.LEADER, "e"), t0 + 2)
        timers.set((Owner.LEADER, "e"), t0 + 4)  # set again: replaces
        timers.set((Owner.JOINER, "r"), t0 + 2.5)
        timers.cancel((Owner.JOINER, "r"))
        await trio.sleep(5)
        n.cancel_scope.cancel()
    assert fired == [(Owner.MICROBATCHES, "tick"), (Owner.FLOWS, "tick"), (Owner.LEADER, "e")]


def test_tensor_store_changes_only_on_keep_and_drop() -> None:
    st = TensorStore()
    a, b = ("d", 1, 0), ("d", 2, 0)
    st.apply([Keep(a, Slot.IN, "x"), Keep(a, Slot.OUT, "y"), Keep(b, Slot.GRAD_IN, "g")])
    assert st.get(a, Slot.OUT) == "y" and st.get(a, Slot.OUT) == "y"  # reading leaves it
    assert st.take(a, Slot.IN) == "x" and st.get(a, Slot.IN) is None  # taking consumes it
    with pytest.raises(KeyError):
        st.take(a, Slot.IN)
    assert st.drops_beside([b]) == [Drop(a)]
    st.apply(st.drops_beside([b]))
    assert st.keys() == {b}
    with pytest.raises(TypeError):
        st.apply(["not an effect"])


def test_peers_neighbours_and_groups() -> None:
    peers = Peers("r1", "r1", 3, Place("relay", 1, 4))
    for pid, role, stage, extra in [("d0", "data", -1, {}), ("a0", "relay", 0, {}), ("b0", "relay", 1, {}),
                                    ("c0", "relay", 2, {}), ("c1", "relay", 2, {"joining": True}),
                                    ("a1", "relay", 0, {"leaving": True, "leave_after": 3})]:
        peers.upsert(PeerInfo(pid, role, stage, pid, **extra), now=0.0)
    assert peers.next_stage_ids() == ["c0", "c1"] and peers.prev_stage_ids() == ["a0", "a1"]
    assert peers.stage_group() == ["b0", "r1"] and peers.data_nodes() == ["d0"]
    assert peers.flow_side(2) == "next" and peers.flow_side(0) == "prev" and peers.flow_side(1) == "peer"
    assert peers.usable(3) >= {"a1"} and "a1" not in peers.usable(4) and "c1" not in peers.usable(0)
    g = peers.groups(4)
    assert g[0] == ["a0"] and g[2] == ["c0"] and g[-1] == ["d0"]
    peers.forget("c0")
    assert peers.is_gone("c0") and "c0" not in peers.next_stage_ids()
    _, changed = peers.upsert(PeerInfo("c0", "relay", 2, "c0"), now=5.0)
    assert changed and not peers.is_gone("c0") and peers.last_change == 5.0
