"""The microbatch machine is told when its inputs change (neighbours, standing, flows), never re-synced before
every event; a component carries out its own machine's effects (runtime/node/microbatches.py, driver.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gwtf_node.model.manifest import default_manifest
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place
from gwtf_node.runtime.node.driver import Drivers
from gwtf_node.runtime.node.microbatches import Microbatches
from gwtf_node.runtime.node.stage import LocalStage


class _Wire:
    me = "r0"

    def __init__(self) -> None:
        self.spawned: list[tuple] = []

    def spawn(self, fn, *args) -> None:
        self.spawned.append((fn, *args))

    async def send(self, peer, msg) -> bool:
        return True


def _relay() -> tuple[Microbatches, Peers, SimpleNamespace, dict[str, list]]:
    manifest = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    peers = Peers("r0", "r0", 2, Place("relay", 0, 2))
    for info in (PeerInfo("d0", "data", -1, "d0", 2), PeerInfo("r1", "relay", 1, "r1", 2)):
        peers.upsert(info, 0.0)
    flows = SimpleNamespace(next_costs={"r1": 5.0}, prev_costs={"d0": 5.0}, links_cfg={}, stamp=1.0,
                            last_change=lambda: flows.stamp, out=lambda: {"d0": {"r1": 1}})
    wire = _Wire()
    mb = Microbatches(wire, peers, SimpleNamespace(hears=lambda p: True), flows,
                      LocalStage(manifest, "relay", "cpu", 0, 1), Drivers(wire), None, policy="gwtf", lend=True,
                      iterations=0, on_settled=lambda it: None, on_finished=lambda: None)
    peers.on_standing = mb.standing_changed
    mb.start()
    told: dict[str, list] = {"neighbours": [], "flows": [], "leave_after": []}
    rec = mb.rec
    for name, attr in (("neighbours", "set_neighbours"), ("flows", "set_flows"), ("leave_after", "leave_after")):
        def spy(*args, _orig=getattr(rec, attr), _name=name):
            told[_name].append(args)
            return _orig(*args)
        setattr(rec, attr, spy)
    return mb, peers, flows, told


@pytest.mark.trio
async def test_the_machine_hears_of_its_neighbours_and_flows_when_they_change() -> None:
    mb, peers, flows, told = _relay()
    mb.neighbours_changed()  # nothing changed: nothing told
    mb.flows_changed()
    assert told == {"neighbours": [], "flows": [], "leave_after": []}
    peers.upsert(PeerInfo("r2", "relay", 1, "r2", 3), 0.0)  # a newcomer of the next stage ...
    flows.next_costs = {"r1": 5.0, "r2": 7.0}
    flows.stamp = 2.0  # ... that the flow machine added
    mb.flows_changed()
    assert [set(a[1]) for a in told["neighbours"]] == [{"r1", "r2"}]
    assert told["neighbours"][0][3] == {"r1": 2, "r2": 3}  # with its capacity
    assert len(told["flows"]) == 1
    peers.upsert(PeerInfo("r2", "relay", 1, "r2", 3, leaving=True, leave_after=-1), 0.0)  # its Hello: it leaves
    mb.neighbours_changed()
    assert [set(a[1]) for a in told["neighbours"]] == [{"r1", "r2"}, {"r1"}]
    peers.set_standing(leaving=True, leave_after=4)  # this node leaves: the machine hears of it at once
    assert told["leave_after"] == [(4,)]
    assert len(told["neighbours"]) == 2 and len(told["flows"]) == 1


def _middle_relay() -> tuple[Microbatches, Peers]:
    """A relay of stage 1 of 3 whose flows of data node d0 come from r0 (stage 0) and go on to r2 (stage 2)."""
    manifest = default_manifest(stages=3, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    peers = Peers("r1", "r1", 3, Place("relay", 1, 2))
    for info in (PeerInfo("d0", "data", -1, "d0", 2), PeerInfo("r0", "relay", 0, "r0", 2),
                 PeerInfo("r2", "relay", 2, "r2", 2)):
        peers.upsert(info, 0.0)
    flows = SimpleNamespace(next_costs={"r2": 5.0}, prev_costs={"r0": 5.0}, links_cfg={}, stamp=1.0,
                            last_change=lambda: flows.stamp, out=lambda: {"d0": {"r2": 1}})
    wire = _Wire()
    wire.me = "r1"
    stage = LocalStage(manifest, "relay", "cpu", 1, 1)
    stage.build(1)
    mb = Microbatches(wire, peers, SimpleNamespace(hears=lambda p: True), flows, stage, Drivers(wire), None,
                      policy="gwtf", lend=True, iterations=0, on_settled=lambda it: None, on_finished=lambda: None)
    mb.start()
    return mb, peers


@pytest.mark.trio
async def test_a_middle_relay_hears_a_data_node_in_the_forwards_it_takes_of_that_data_nodes_microbatches() -> None:
    import torch

    from gwtf_node.model.tensors import pack
    from gwtf_node.protocol import messages as m
    from gwtf_node.runtime.net.wire import now

    mb, peers = _middle_relay()
    assert peers.watches_loosely("d0")
    header, payload = pack(torch.zeros(mb.stage.model.expected_hidden_shape(2)))
    peers.last_heard["d0"] = heard = now() - 20.0  # nothing from the data node itself for 20 s
    await mb.on_message("r0", m.Recover("d0", 0, 0, ("d0", "r0"), ("r2", "d0"), header), payload)
    assert peers.last_heard["d0"] == heard  # a Recover may replay an old pass: not news of the data node
    await mb.on_message("r0", m.Forward("d0", 1, 0, ("d0", "r0", "r1", "r2"), header), payload)
    assert peers.last_heard["d0"] > heard + 19.0  # its fresh forward, taken: the data node is at work
    peers.last_heard["d0"] = heard
    await mb.on_message("r0", m.Forward("d0", 1, 0, ("d0", "r0", "r1", "r2"), header), payload)
    assert peers.last_heard["d0"] == heard  # the same forward again is not taken: no news either
