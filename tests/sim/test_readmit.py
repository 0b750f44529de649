"""A peer presumed dead (or gone) that is heard again is taken back: table tests, machines, and node pairs.

* `Peers.arrival` and `readmission_refusal`: what a Hello means, and when a
  peer coming back is refused.
* `AddressBook`: the peers met, kept in the state directory for a restart.
* The recovery machine: a data node gone and back starts clean at a relay
  (its old records and contributions are dropped; the same keys are taken
  again).
* The flow machines of a data node and three relays in the simulator: a
  data node restarted with a new flow machine gets its flows back only if the
  relays forget its old waves (`data_node_back`).
* Two daemons' components (`Node`: discovery, liveness and the frame table;
  the other components recorded) on an in-memory wire that encodes every
  frame: a data node presumed dead comes back (BACK) and is greeted again, a
  data node restarted before it was found dead (RESTARTED) has its old
  incarnation forgotten first, a stage peer far ahead is taken back and this
  relay told to catch up from it, and frames
  from a gone or unknown peer other than Hello are ignored, not refused (so
  is a gone peer's Hello that says it leaves).
* A relay with no data node says that it waits, then every 30 s.
* A data node back from its checkpoint settles the run's step
  (data_resume.py): alone, the relays' step (it says when it is behind);
  among other data nodes, it downloads the data part.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import AsyncMock, Mock

import pytest
import trio
import trio.testing

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.protocol import messages as m
from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.recovery import Key, RecoveryConfig, RecoveryNode
from gwtf_node.runtime.net.discovery import Discovery
from gwtf_node.runtime.node.liveness import Liveness
from gwtf_node.runtime.node.node import Node, NodeOptions, routes
from gwtf_node.runtime.net.peers import AddressBook, Arrival, PeerInfo, Peers, Place, readmission_refusal
from gwtf_node.runtime.net.wire import Wire
from gwtf_node.sim.engine import Simulator


# ---------------------------------------------------------------------------------------------- the table
def test_arrival_of_a_hello() -> None:
    peers = Peers("me", "me", 2, Place("relay", 0, 4))
    assert peers.arrival("d0", 7) is Arrival.NEW
    peers.upsert(PeerInfo("d0", "data", -1, incarnation=7), now=0.0)
    assert peers.arrival("d0", 7) is Arrival.SAME
    assert peers.arrival("d0", 0) is Arrival.SAME  # (a peer that does not say its incarnation)
    assert peers.arrival("d0", 8) is Arrival.RESTARTED
    peers.forget("d0")
    assert peers.arrival("d0", 7) is Arrival.BACK and peers.arrival("d0", 8) is Arrival.BACK
    peers.upsert(PeerInfo("d0", "data", -1, incarnation=8), now=1.0)
    assert not peers.is_gone("d0") and peers.arrival("d0", 8) is Arrival.SAME


@pytest.mark.parametrize("info, mine, refused", [
    (PeerInfo("r", "relay", 1, steps=5), ("relay", 1, 4), None),  # one aggregation ahead: it stepped first
    (PeerInfo("r", "relay", 1, steps=6), ("relay", 1, 4), None),  # far ahead: this node was cut off, catches up
    (PeerInfo("r", "relay", 1, steps=6, joining=True), ("relay", 1, 4), None),  # it downloads the state
    (PeerInfo("r", "relay", 0, steps=9), ("relay", 1, 4), None),  # another stage: its own history
    (PeerInfo("r", "relay", 1, steps=0), ("relay", 1, 4), None),  # behind: it catches up as a joiner
    (PeerInfo("r", "relay", -2), ("relay", 1, 4), None),  # --stage auto, not placed yet
    (PeerInfo("r", "relay", 3), ("relay", 1, 4), "stages 0..1"),
    (PeerInfo("d", "data", -1, steps=9), ("relay", 0, 4), None),  # a data node's step is settled by the data node
])
def test_readmission_refusal(info: PeerInfo, mine: tuple, refused: str | None) -> None:
    role, stage, steps = mine
    why = readmission_refusal(info, n_stages=2)
    assert (why is None) if refused is None else (why is not None and refused in why), why


def test_address_book_round_trip(tmp_path: Path) -> None:
    book = AddressBook(tmp_path / "peers.json", "run-1")
    book.note("A", ("/ip4/127.0.0.1/tcp/1/p2p/A",))
    book.note("B", ("/ip4/127.0.0.1/tcp/2",))
    book.note("me", ("/ip4/127.0.0.1/tcp/3/p2p/me",))
    book.note("C", ())  # no address: nothing to keep
    again = AddressBook(tmp_path / "peers.json", "run-1")
    assert set(again.load()) == {"A", "B", "me"}
    assert again.dial_addrs("me") == ["/ip4/127.0.0.1/tcp/1/p2p/A", "/ip4/127.0.0.1/tcp/2/p2p/B"]
    assert AddressBook(tmp_path / "peers.json", "run-2").load() == {}  # another run's peers would refuse it
    (tmp_path / "peers.json").write_text("not json")
    assert AddressBook(tmp_path / "peers.json", "run-1").load() == {}


# ---------------------------------------------------------------------------------------------- recovery
def _relay(data_nodes=("d0",)) -> RecoveryNode:
    cfg = RecoveryConfig(node_id="a0", stage=0, last_stage=1, capacity=4, data_nodes=data_nodes,
                         next_peers={"b0": 1.0}, prev_peers={d: 1.0 for d in data_nodes},
                         peer_capacity={"b0": 4}, default_prior_s=1.0, e2e_prior_s=2.0, probe_wait_s=1.0)
    return RecoveryNode(cfg, random.Random(0))


def test_a_data_node_back_starts_clean_at_a_relay() -> None:
    relay = _relay()
    key = ("d0", 9, 2)
    eff = relay.on_message(0.0, "d0", m.Forward(*key, ("d0",), None, 0))
    assert key in relay.mbs and any(getattr(e, "kind", None) == "forward" for e in eff)
    relay.contrib[2] = {Key("d0", 8, 2)}
    relay.peer_gone(1.0, "d0")  # presumed dead: its microbatches and contributions die with it
    assert key not in relay.mbs and relay.contrib[2] == set() and "d0" not in relay.cfg.data_nodes
    relay.peer_back(2.0, "d0", data_node=True)
    assert relay.cfg.data_nodes == ("d0",) and "d0" not in relay.gone and "d0" not in relay.dead
    # the reopened iteration's microbatch, same key and attempt as the old incarnation's: taken, computed again
    eff = relay.on_message(3.0, "d0", m.Forward(*key, ("d0",), None, 0))
    assert key in relay.mbs and any(getattr(e, "kind", None) == "forward" for e in eff)


# ---------------------------------------------------------------------------------------------- flow machines
def _flow_configs() -> dict[str, FlowConfig]:
    return {
        "d0": FlowConfig("d0", True, 4, ("d0",), {"a0": 1.0, "a1": 2.0}, {"b0": 1.0}),
        "a0": FlowConfig("a0", False, 2, ("d0",), {"b0": 1.0}, {"d0": 1.0}, peers=("a1",)),
        "a1": FlowConfig("a1", False, 2, ("d0",), {"b0": 1.0}, {"d0": 2.0}, peers=("a0",)),
        "b0": FlowConfig("b0", False, 4, ("d0",), {"d0": 1.0}, {"a0": 1.0, "a1": 1.0}),
    }


def _placed(node: FlowNode) -> int:
    return sum(node.out["d0"].values())


@pytest.mark.parametrize("forget_waves", [True, False])
def test_a_restarted_data_node_gets_its_flows_back(forget_waves: bool) -> None:
    """The simulator's event queue (sim/engine.py) carries the frames; the relays are told of the crash and the
    return as the daemon tells them (flows.py: `remove_neighbour`, then `data_node_back` and `add_neighbour`)."""
    sim = Simulator(lambda a, b: 0.005)
    cfgs = _flow_configs()
    nodes = {nid: FlowNode(cfg, random.Random(nid)) for nid, cfg in cfgs.items()}
    for nid, node in nodes.items():
        sim.add(nid, node)
    sim.start_all()
    sim.run_until(30.0)
    assert _placed(nodes["d0"]) == 4
    assert nodes["a0"].epoch["d0"] >= 1
    sim.kill("d0")  # its neighbours find it dead and remove it
    for nid in ("a0", "a1", "b0"):
        sim._apply(nid, nodes[nid].remove_neighbour(sim.now, "d0"))
    sim.run_until(sim.now + 10.0)
    assert all(sum(nodes[n].inn["d0"].values()) == 0 for n in ("a0", "a1", "b0"))
    # it comes back with a new flow machine (its waves count from the start again); its relays take it back
    sim.dead.discard("d0")
    nodes["d0"] = FlowNode(cfgs["d0"], random.Random("d0 again"))
    sim.add("d0", nodes["d0"])
    for nid, side, cost in (("a0", "prev", 1.0), ("a1", "prev", 2.0), ("b0", "next", 1.0)):
        if forget_waves:
            sim._apply(nid, nodes[nid].data_node_back(sim.now, "d0"))
        sim._apply(nid, nodes[nid].add_neighbour(sim.now, "d0", cost, side))
    sim._apply("d0", nodes["d0"].start(sim.now))
    sim.run_until(sim.now + 30.0)
    placed = _placed(nodes["d0"])
    if forget_waves:
        assert placed == 4, nodes["d0"].out
    else:
        assert placed < 4  # its new waves are older than what the relays saw: ignored


# ---------------------------------------------------------------------------------------------- two daemons
class FakeHost:
    """A libp2p host on an in-memory wire: `send` hands the encoded frame to the other node's `_on_frame`."""

    def __init__(self, peer_id: str, net: dict[str, "Node"]) -> None:
        self.peer_id = peer_id
        self.net = net
        self.addrs = [f"/ip4/127.0.0.1/tcp/{len(net) + 4000}/p2p/{peer_id}"]
        self.tensor_addr = "127.0.0.1:1"
        self.links = Mock()
        self.noted: list[tuple[str, tuple]] = []

    async def connect(self, addr: str, *more: str) -> str:
        return addr.rsplit("/p2p/", 1)[-1]

    def note_addrs(self, peer_id: str, addrs) -> int:
        self.noted.append((peer_id, tuple(addrs)))
        return len(addrs)

    def addrs_for(self, peer_id: str) -> list[str]:
        return self.addrs

    def usable_addrs(self, peer_id: str, addrs) -> list[str]:
        return list(addrs)

    def peer_is_local(self, peer_id: str) -> bool:
        return True

    async def send(self, peer: str, envelope: bytes, payload=b"") -> None:
        await self.net[peer]._on_frame(self.peer_id, envelope, payload)


def _node(tmp_path: Path, run: Path, name: str, peer_id: str, role: str, stage: int | None, net: dict,
          nursery: trio.Nursery, steps: int = 0) -> Node:
    node = Node(NodeOptions(run_path=run, role=role, stage=stage, state_dir=tmp_path / name, name=name,
                            insecure_unsigned=True))
    (tmp_path / name).mkdir(exist_ok=True)
    node.stage.set_steps(steps)
    host = FakeHost(peer_id, net)
    peers = Peers(peer_id, name, 2, Place(role, -1 if role == "data" else stage, 4))
    node.peers = peers
    wire = Wire(peer_id, host, nursery, peers)
    liveness = Liveness(wire, peers, on_dead=node._peer_gone, incarnation=node.incarnation)
    discovery = Discovery(wire, peers, host, node.manifest, {}, on_peer_hello=node._peer_hello,
                          applied_steps=lambda: node.stage.applied_steps, incarnation=node.incarnation,
                          on_peer_back=node._peer_back)
    others = {n: Mock(name=n) for n in ("flows", "microbatches", "aggregation", "leadership", "joining", "cutcheck",
                                        "status", "bootstrap", "spread")}
    node.parts = SimpleNamespace(wire=wire, liveness=liveness, discovery=discovery, **others)
    node.routes = routes(node.parts)
    net[peer_id] = node
    return node


@pytest.mark.trio
async def test_a_data_node_back_and_restarted_is_taken_back(tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    net: dict[str, Node] = {}
    async with trio.open_nursery() as nursery:
        relay = _node(tmp_path, run, "r0", "R0", "relay", 0, net, nursery, steps=3)
        peer = _node(tmp_path, run, "r0b", "R0B", "relay", 0, net, nursery, steps=3)
        data = _node(tmp_path, run, "d0", "D0", "data", None, net, nursery, steps=3)
        for n in (data, peer):
            await n.parts.discovery.dial(relay.parts.discovery.host.addrs[0])
        await trio.testing.wait_all_tasks_blocked()
        assert "D0" in relay.peers and "R0" in data.peers and "R0B" in relay.peers
        assert relay.book.load().keys() == {"D0", "R0B"}  # its address book, for its own restart

        # presumed dead: forgotten everywhere; its late frames are ignored, not refused
        relay.parts.liveness._presume_dead("D0", 7.0)
        assert relay.peers.is_gone("D0") and relay.parts.liveness.crashed == {"D0"}
        relay.parts.microbatches.peer_gone.assert_called_with("D0")
        await data.parts.wire.send("R0", m.CanTake(2, 0))
        await data.parts.wire.send("R0", m.Goodbye(1))
        assert relay.parts.wire.refused == 0

        # it comes back (BACK): the same peer id, a new process; greeted again, taken back everywhere
        del net["D0"]
        back = _node(tmp_path, run, "d0", "D0", "data", None, net, nursery, steps=3)
        await back.parts.discovery.dial(relay.parts.discovery.host.addrs[0])
        await trio.testing.wait_all_tasks_blocked()
        assert "D0" in relay.peers and not relay.peers.is_gone("D0")
        assert relay.parts.liveness.crashed == set()
        relay.parts.microbatches.peer_back.assert_called_with("D0", same=False)  # a new process
        relay.parts.flows.peer_back.assert_called()
        assert relay.parts.discovery.host.noted[-1][0] == "D0"  # its new addresses, for dialling it again
        assert "R0" in back.peers  # the relay answered its Hello (it had greeted the old one)
        assert relay.parts.wire.refused == 0

        # it restarts again before anyone found it dead (RESTARTED): the old incarnation is forgotten first
        relay.parts.microbatches.peer_gone.reset_mock()
        del net["D0"]
        again = _node(tmp_path, run, "d0", "D0", "data", None, net, nursery, steps=3)
        assert again.incarnation != back.incarnation
        await again.parts.discovery.dial(relay.parts.discovery.host.addrs[0])
        await trio.testing.wait_all_tasks_blocked()
        relay.parts.microbatches.peer_gone.assert_called_once_with("D0")
        assert "D0" in relay.peers and relay.peers.get("D0").incarnation == again.incarnation
        assert "R0" in again.peers

        # a stage peer that comes back more than one aggregation ahead (this relay was cut off while the stage
        # stepped) is taken back, and this relay is told to catch up from it
        relay.parts.liveness._presume_dead("R0B", 7.0)
        del net["R0B"]
        ahead = _node(tmp_path, run, "r0b", "R0B", "relay", 0, net, nursery, steps=5)
        await ahead.parts.discovery.dial(relay.parts.discovery.host.addrs[0])
        await trio.testing.wait_all_tasks_blocked()
        assert "R0B" in relay.peers and relay.parts.wire.refused == 0
        told = relay.parts.joining.catch_up.call_args.args[0]
        assert (told.peer_id, told.steps) == ("R0B", 5)
        # a gone peer's Hello saying it leaves (a late frame of its leave, overtaken by its Goodbye): ignored
        relay.parts.liveness._presume_dead("R0B", 7.0)
        ahead.peers.set_standing(leaving=True, leave_after=5)
        await ahead.parts.wire.send("R0", ahead.parts.discovery.hello("R0"))
        await trio.testing.wait_all_tasks_blocked()
        assert relay.peers.is_gone("R0B") and relay.parts.wire.refused == 0
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_peer_presumed_dead_that_is_still_there_is_redialled_and_taken_back(tmp_path: Path) -> None:
    """A partition or a long stall: the relay presumed the data node dead, the data node did not.  The relay's
    redial loop greets it again (at the address of its address book) after REDIAL_FIRST_S, saying it forgot it:
    the data node forgets the relay too (both ends start over) and both take each other back."""
    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    net: dict[str, Node] = {}
    async with trio.open_nursery() as nursery:
        relay = _node(tmp_path, run, "r0", "R0", "relay", 0, net, nursery, steps=3)
        data = _node(tmp_path, run, "d0", "D0", "data", None, net, nursery, steps=3)
        await data.parts.discovery.dial(relay.parts.discovery.host.addrs[0])
        await trio.testing.wait_all_tasks_blocked()
        relay.parts.liveness._presume_dead("D0", 7.0)
        assert relay.peers.is_gone("D0")
        nursery.start_soon(relay.parts.discovery.redial_loop, lambda: set(relay.parts.liveness.crashed),
                           lambda pid: relay.book.known.get(pid, []))
        with trio.fail_after(10):
            while "D0" not in relay.peers:
                await trio.sleep(0.1)
        assert relay.parts.liveness.crashed == set() and "R0" in data.peers
        data.parts.microbatches.peer_gone.assert_called_with("R0")  # the data node forgot it too, then took it back
        data.parts.microbatches.peer_back.assert_called_with("R0", same=True)  # (the same process)
        nursery.cancel_scope.cancel()


def test_a_relay_without_a_data_node_says_that_it_waits(caplog) -> None:
    peers = Peers("r0", "r0", 2, Place("relay", 0, 4))
    liveness = Liveness(Mock(), peers, on_dead=lambda p: None)
    peers.upsert(PeerInfo("d0", "data", -1), now=0.0)
    caplog.set_level("INFO", logger="gwtf.node")
    t0 = 1000.0
    liveness._check_data_nodes(t0)
    assert liveness.waiting_for_data_since is None
    peers.forget("d0")
    for s in range(0, 65, 1):  # 65 s without a data node: said at once, then every 30 s
        liveness._check_data_nodes(t0 + s)
    said = [r.getMessage() for r in caplog.records if "waiting for a data node" in r.getMessage()]
    assert len(said) == 3 and liveness.waiting_for_data_since == t0, said
    peers.upsert(PeerInfo("d0", "data", -1), now=70.0)
    liveness._check_data_nodes(t0 + 70)
    assert liveness.waiting_for_data_since is None
    assert any("a data node is back after 70 s" in r.getMessage() for r in caplog.records)



# ---------------------------------------------------------------------------------------------- the run's step
class _Stage:
    def __init__(self, steps: int) -> None:
        self.applied_steps = steps

    def set_steps(self, steps: int) -> None:
        self.applied_steps = steps


def _data_peers(others: list[PeerInfo]) -> Peers:
    peers = Peers("d0", "d0", 2, Place("data", -1, 4, joining=True))  # back from its checkpoint: joining
    for info in others:
        peers.upsert(info, now=0.0)
    return peers


@pytest.mark.trio
@pytest.mark.parametrize("relay_steps, steps_after", [(5, 5), (6, 6), (4, 5)])
async def test_a_lone_data_node_takes_the_relays_step(relay_steps: int, steps_after: int, caplog) -> None:
    """Its checkpoint holds 5 steps.  Relays at 5: it resumes at 5.  Relays at 6 (it died after they stepped):
    it says it is 1 step behind and goes on from 6.  Relays behind: it keeps its step."""
    from gwtf_node.runtime.node import data_resume

    peers = _data_peers([PeerInfo("a", "relay", 0, steps=relay_steps), PeerInfo("b", "relay", 1, steps=relay_steps),
                         PeerInfo("j", "relay", 1, steps=9, joining=True)])  # (a joiner's steps do not count)
    stage, joining, aggregation, discovery = _Stage(5), Mock(), Mock(), Mock()
    assert peers.data_nodes_ready(5) == []  # nobody waits for it while it settles its step
    await data_resume.take_run_step(peers, stage, joining, aggregation, discovery)
    assert stage.applied_steps == steps_after
    assert not peers.place.joining and peers.place.ready_from == steps_after
    assert peers.data_nodes_ready(steps_after) == ["d0"] and peers.data_nodes_ready(steps_after - 1) == []
    discovery.hello_all.assert_called_once()
    joining.fetch_state.assert_not_called()
    behind = [r.getMessage() for r in caplog.records if "step(s) behind" in r.getMessage()]
    assert bool(behind) == (relay_steps > 5), behind
    if relay_steps > 5:
        aggregation.resynced.assert_called_once_with(6)


@pytest.mark.trio
async def test_a_data_node_back_among_others_downloads_the_data_part() -> None:
    from gwtf_node.runtime.node import data_resume

    peers = _data_peers([PeerInfo("d1", "data", -1, steps=8), PeerInfo("d2", "data", -1, steps=9),
                         PeerInfo("d3", "data", -1, steps=12, joining=True), PeerInfo("a", "relay", 0, steps=9)])
    stage, joining = _Stage(5), Mock()

    async def fetch_state(source: str, after: int) -> None:
        joining.asked = (source, after)

    joining.fetch_state = fetch_state
    await data_resume.take_run_step(peers, stage, joining, Mock(), Mock())
    assert joining.asked == ("d2", 10)  # the ready data node with the most steps, after its iteration in flight


@pytest.mark.trio
@pytest.mark.parametrize("theirs, cut_off, verdict", [("other", True, "fetch"), ("same", True, "same"),
                                                      ("other", False, "keep"), ("same", False, "same")])
async def test_a_stage_peer_back_at_the_same_step_is_compared(tmp_path: Path, theirs: str, cut_off: bool,
                                                            verdict: str) -> None:
    """cutcheck.py: r0 presumed its stage peer dead, and (cut_off) was without a data node since; the peer comes
    back saying the same step.  r0 asks it for the hash of its part at that step.  With no round record to tell
    the copies apart, the one cut off fetches the other's (its stage stayed with the run) and a relay that kept
    its data node keeps its own (the peer, cut off, fetches it); the same hash changes nothing."""
    from gwtf_node.runtime.node.cutcheck import CutCheck
    from gwtf_node.runtime.net.wire import now

    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    net: dict[str, Node] = {}
    async with trio.open_nursery() as nursery:
        relay = _node(tmp_path, run, "r0", "R0", "relay", 0, net, nursery, steps=3)
        relay.stage.build(0)
        relay.stage.set_steps(3)
        peer = _node(tmp_path, run, "r0b", "R0B", "relay", 0, net, nursery, steps=3)
        data = _node(tmp_path, run, "d0", "D0", "data", None, net, nursery, steps=3)
        for n in (data, peer):
            await n.parts.discovery.dial(relay.parts.discovery.host.addrs[0])
        await trio.testing.wait_all_tasks_blocked()
        mine = relay.stage.model.state_hash()
        joining = Mock(ask_hash=AsyncMock(return_value=m.StageState(0, 3, "", None,
                                                                     params_sha256=mine if theirs == "same" else "x")),
                       fetch_state=AsyncMock())
        relay.parts.cutcheck = CutCheck(relay.parts.wire, relay.peers, relay.stage, relay.parts.liveness, joining)
        relay.parts.liveness._presume_dead("R0B", 7.0)
        if cut_off:
            relay.parts.liveness._presume_dead("D0", 7.0)
            relay.parts.liveness._check_data_nodes(now())  # no data node: waiting for one
        await peer.parts.discovery.greet(relay.parts.discovery.host.addrs[0])  # (its Hello: back at 3 steps)
        with trio.fail_after(10):
            await trio.testing.wait_all_tasks_blocked()
            while not relay.parts.cutcheck.checks:
                await trio.sleep(0.05)
        assert "R0B" in relay.peers
        joining.ask_hash.assert_called_once()
        assert joining.ask_hash.call_args.args[1] == m.StageStateRequest(0, 3, hash_only=True)
        assert relay.parts.cutcheck.checks[-1]["verdict"] == verdict
        if verdict == "fetch":
            joining.fetch_state.assert_called_once_with("R0B", 3)
        else:
            joining.fetch_state.assert_not_called()
        nursery.cancel_scope.cancel()



@pytest.mark.trio
@pytest.mark.parametrize("their_count, verdict", [(3.0, "fetch"), (1.0, "keep")])
async def test_a_step_summed_without_a_named_member_is_compared_with_it(tmp_path: Path, their_count: float,
                                                                        verdict: str) -> None:
    """cutcheck.py `parted`: r0 stepped iteration 3 alone (2 contributions) though BEGIN named r0b, which stepped
    alone too.  r0 asks r0b until both hold 4 steps (r0b first answers at 3: still in its round), then compares
    the round records where the copies parted: the copy that summed more contributions is kept, the other
    fetched."""
    from gwtf_node.protocol.roundcheck import RoundOf
    from gwtf_node.runtime.node.cutcheck import CutCheck

    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    net: dict[str, Node] = {}
    async with trio.open_nursery() as nursery:
        relay = _node(tmp_path, run, "r0", "R0", "relay", 0, net, nursery, steps=4)
        relay.stage.build(0)
        relay.stage.set_steps(4)
        peer = _node(tmp_path, run, "r0b", "R0B", "relay", 0, net, nursery, steps=4)
        await peer.parts.discovery.dial(relay.parts.discovery.host.addrs[0])
        await trio.testing.wait_all_tasks_blocked()
        full = m.RoundRecord(3, 4.0, ("R0", "R0B"))
        answers = [m.StageState(0, 3, "", None, params_sha256="old", rounds=(full,)),
                   m.StageState(0, 4, "", None, params_sha256="theirs",
                                rounds=(full, m.RoundRecord(4, their_count, ("R0B",))))]
        joining = Mock(ask_hash=AsyncMock(side_effect=answers), fetch_state=AsyncMock())
        rounds = {3: RoundOf(4.0, ("R0", "R0B")), 4: RoundOf(2.0, ("R0",))}
        check = CutCheck(relay.parts.wire, relay.peers, relay.stage, relay.parts.liveness, joining,
                         rounds=lambda: rounds)
        check.parted(3, ["R0B"], patience_s=10.0)
        with trio.fail_after(10):
            while not check.checks:
                await trio.sleep(0.05)
        assert joining.ask_hash.call_count == 2
        assert check.checks[-1] == {"peer": "r0b", "steps": 4, "verdict": verdict}
        if verdict == "fetch":
            joining.fetch_state.assert_called_once_with("R0B", 4)
        else:
            joining.fetch_state.assert_not_called()
        nursery.cancel_scope.cancel()
