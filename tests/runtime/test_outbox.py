"""A machine driver's batches to one peer reach the wire in the order they were flushed (`Outbox`, `fifo`)."""

from __future__ import annotations

import pytest
import trio

from gwtf_node.runtime.node.driver import RESEND_FIRST_S, RESEND_MAX_S, MachineDriver, Outbox, Owner, Timers

pytestmark = pytest.mark.trio


class _Wire:
    """What a driver needs of the wire: `spawn` (tasks in the test's nursery) and `send` (not used here)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.spawn = nursery.start_soon

    async def send(self, peer: str, msg) -> None:
        raise AssertionError("a driver with `in_order` sends its batches through it")


def _slow_first(sent: list):
    async def send_batch(peer: str, msgs: list) -> None:
        for msg in msgs:
            await trio.sleep(0.05 if msg == "slow" else 0)  # a stream that takes a while to open
            sent.append((peer, msg))
    return send_batch


async def test_outbox_keeps_a_peers_batches_in_order():
    sent: list = []
    async with trio.open_nursery() as nursery:
        box = Outbox(_Wire(nursery), _slow_first(sent))
        box.put("a", ["slow", "a1"])
        box.start()
        await trio.sleep(0)
        box.put("a", ["a2"])
        box.put("b", ["b1"])
        box.start()
    assert [msg for peer, msg in sent if peer == "a"] == ["slow", "a1", "a2"]
    assert ("b", "b1") in sent and sent.index(("b", "b1")) < sent.index(("a", "slow"))  # peers do not wait
    assert box.sending == set() and not any(box.queued.values())


async def _flush_two_batches(fifo: bool) -> list:
    sent: list = []
    async with trio.open_nursery() as nursery:
        wire = _Wire(nursery)
        d = MachineDriver(wire, Timers(lambda *a: None), Owner.FLOWS, lambda k: None,
                          in_order=_slow_first(sent), fifo=fifo)
        d.send("p", "slow")
        d.flush()
        d.send("p", "second")
        d.flush()
    return [msg for _, msg in sent]


async def test_fifo_driver_sends_batches_in_flush_order():
    assert await _flush_two_batches(fifo=True) == ["slow", "second"]


async def test_driver_without_fifo_sends_each_batch_in_a_task_of_its_own():
    # the case `fifo` exists for: two batches to one peer, each in a task of its own, reach the wire reordered
    assert await _flush_two_batches(fifo=False) == ["second", "slow"]


class _Peers:
    def __init__(self) -> None:
        self.gone: set[str] = set()

    def is_gone(self, peer: str) -> bool:
        return peer in self.gone


def _failing(sent: list, fail: dict[str, int]):
    """A batch sender whose send of message `m` fails the first `fail[m]` times; how many of a batch went."""
    async def send_batch(peer: str, msgs: list) -> int:
        for i, msg in enumerate(msgs):
            if fail.get(msg, 0) > 0:
                fail[msg] -= 1
                return i
            sent.append((peer, msg))
        return len(msgs)
    return send_batch


def _failing_box(nursery: trio.Nursery, sent: list, fail: dict[str, int]) -> tuple[Outbox, _Peers]:
    """An outbox whose sends of message `m` fail the first `fail[m]` times (`_failing`), and its wire's peers."""
    wire = _Wire(nursery)
    wire.peers = _Peers()
    return Outbox(wire, _failing(sent, fail)), wire.peers


async def test_outbox_sends_what_failed_again_in_order(autojump_clock):
    sent: list = []
    async with trio.open_nursery() as nursery:
        box, _peers = _failing_box(nursery, sent, {"a2": 3})
        box.put("a", ["a1", "a2", "a3"])
        box.start()
        await trio.sleep(0.1)
        box.put("a", ["a4"])  # (queued behind what failed)
        box.start()
    assert [msg for _, msg in sent] == ["a1", "a2", "a3", "a4"]
    assert box.resent == 2 + 3 + 3  # a2 and a3 the first time, with a4 behind them the next two
    assert trio.current_time() >= RESEND_FIRST_S * (1 + 2 + 4)  # (backing off: 0.5, 1, 2 s)


async def test_outbox_drops_the_queue_of_a_peer_that_is_gone(autojump_clock):
    sent: list = []
    async with trio.open_nursery() as nursery:
        box, peers = _failing_box(nursery, sent, {"a1": 1000})
        box.put("a", ["a1", "a2"])
        box.put("b", ["b1"])
        box.start()
        await trio.sleep(30.0)
        assert "a" in box.sending and sent == [("b", "b1")]  # a's first message keeps failing: sent again ...
        peers.gone.add("a")  # ... until the peer is presumed dead
        await trio.sleep(RESEND_MAX_S + 1)
        assert "a" not in box.sending and "a" not in box.queued
    assert sent == [("b", "b1")]
