"""The all-reduce's survivors (runtime/node/regroup.py): a member presumed dead keeps its place in a round for a
grace, and one back with its incarnation was never dead; one that left or restarted is left out at once.

Each test drives `Regroup.all_reduce` with a round function that waits until the test ends it (or its scope is
cancelled), under trio's virtual clock."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place
from gwtf_node.runtime.node.regroup import GROUP_CHANGE_WAIT_S, REJOIN_GRACE_S, Regroup

ME, A, B = "12D3KooWme", "12D3KooWaa", "12D3KooWbb"


def _regroup() -> Regroup:
    peers = Peers(ME, "r0_0", 2, Place("relay", 0, 1))
    for pid, name in ((A, "r0_1"), (B, "r0_2")):
        peers.upsert(PeerInfo(pid, "relay", 0, name=name, incarnation=7), 0.0)
    return Regroup(ME, peers)


class Rounds:
    """`run_round` for Regroup.all_reduce: records each round's group; a round ends when `finish` is set."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.finish = trio.Event()

    async def run_round(self, gkey: str, group: list[str]):
        self.groups.append(group)
        await self.finish.wait()
        return ("sum", len(group))


async def _reduce(rg: Regroup, rounds: Rounds, out: list) -> None:
    """The stage's all-reduce of BEGIN's group [ME, A, B]; its (result, key, group) appended to `out`."""
    out.append(await rg.all_reduce("s0/it3", [ME, A, B], rounds.run_round))


@asynccontextmanager
async def _round_in_flight():
    """A regroup whose all-reduce of [ME, A, B] has been in flight for 1 s: (regroup, rounds, out, nursery)."""
    rg, rounds, out = _regroup(), Rounds(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reduce, rg, rounds, out)
        await trio.sleep(1.0)
        yield rg, rounds, out, nursery


def _presume_dead(rg: Regroup, peer: str, nursery: trio.Nursery, presumed: bool = True) -> None:
    """What the node does when liveness presumes `peer` dead, or (`presumed=False`) it says Goodbye
    (node.py `_peer_gone`)."""
    rg.peers.forget(peer)
    rg.forget(peer, presumed=presumed)
    rg.after_gone(peer, nursery.start_soon)


def _back(rg: Regroup, peer: str, incarnation: int) -> None:
    """`peer` says Hello again (node.py `_peer_back` / `_peer_hello`)."""
    same = incarnation == rg.peers.former_incarnations.get(peer)
    rg.peers.upsert(PeerInfo(peer, "relay", 0, incarnation=incarnation), trio.current_time())
    rg.returned(peer, same_incarnation=same)


@pytest.mark.trio
async def test_a_member_back_as_it_was_within_the_grace_keeps_the_round(autojump_clock: trio.testing.MockClock) -> None:
    async with _round_in_flight() as (rg, rounds, out, nursery):
        _presume_dead(rg, B, nursery)  # a false death: B computes on, its frames lost for a while
        await trio.sleep(REJOIN_GRACE_S / 2)
        _back(rg, B, incarnation=7)
        await trio.sleep(REJOIN_GRACE_S)  # past the grace: the round was not cancelled
        rounds.finish.set()
    (result, gkey, group), = out
    assert rounds.groups == [sorted([ME, A, B])] and group == sorted([ME, A, B]) and result == ("sum", 3)
    assert rg.alive([ME, A, B], {}) == sorted([ME, A, B])  # and the next rounds count it too


@pytest.mark.trio
async def test_a_member_not_back_within_the_grace_is_left_out(autojump_clock: trio.testing.MockClock) -> None:
    async with _round_in_flight() as (rg, rounds, out, nursery):
        t_dead = trio.current_time()
        _presume_dead(rg, B, nursery)
        while len(rounds.groups) < 2:
            await trio.sleep(0.1)
        redone = trio.current_time() - t_dead
        rounds.finish.set()
    assert rounds.groups == [sorted([ME, A, B]), sorted([ME, A])] and out[0][2] == sorted([ME, A])
    assert REJOIN_GRACE_S <= redone < REJOIN_GRACE_S + 1.0


@pytest.mark.trio
async def test_a_member_back_as_it_was_after_the_grace_is_taken_back_into_the_round(
        autojump_clock: trio.testing.MockClock) -> None:
    """B comes back with its incarnation just after the grace: the round redone without it is redone again with
    it (B, which held this node dead in turn, does the same on its side), not left to time out against B's."""
    async with _round_in_flight() as (rg, rounds, out, nursery):
        _presume_dead(rg, B, nursery)
        while len(rounds.groups) < 2:
            await trio.sleep(0.1)
        await trio.sleep(1.0)
        _back(rg, B, incarnation=7)
        await trio.sleep(1.0)
        rounds.finish.set()
    assert rounds.groups == [sorted([ME, A, B]), sorted([ME, A]), sorted([ME, A, B])]
    assert out[0][2] == sorted([ME, A, B]) and out[0][0] == ("sum", 3)


@pytest.mark.trio
async def test_a_member_that_left_or_restarted_is_left_out_at_once(autojump_clock: trio.testing.MockClock) -> None:
    async with _round_in_flight() as (rg, rounds, out, nursery):
        _presume_dead(rg, B, nursery, presumed=False)  # B said Goodbye
        await trio.sleep(0.5)
        assert rounds.groups == [sorted([ME, A, B]), sorted([ME, A])]
        _presume_dead(rg, A, nursery)
        await trio.sleep(2.0)
        _back(rg, A, incarnation=8)  # back, but restarted: what it held died with the old process
        await trio.sleep(REJOIN_GRACE_S)
        rounds.finish.set()
    assert rounds.groups == [sorted([ME, A, B]), sorted([ME, A])] and out[0][2] == [ME]  # (one: no round)
    assert out[0][0] is None  # a group of one: the caller steps on its own contribution


@pytest.mark.trio
async def test_a_restarted_member_that_forgot_us_stays_out_of_the_round(autojump_clock: trio.testing.MockClock) -> None:
    """B restarts while the round is in flight; its new incarnation never got our Hello, so both ends forget each
    other once more and take each other back as they are (node.py, FORGOT_US).  That second forgetting was false;
    the restart was not: B's contributions died with its old process, and the round stays among the survivors
    (as its stage-mates that did not see the second forgetting redo it)."""
    async with _round_in_flight() as (rg, rounds, out, nursery):
        _presume_dead(rg, B, nursery, presumed=False)  # B restarted: the old incarnation forgotten at once
        _back(rg, B, incarnation=8)
        await trio.sleep(0.5)
        _presume_dead(rg, B, nursery)  # it forgot us: forgotten again, presumed ...
        _back(rg, B, incarnation=8)  # ... and back as it is now
        await trio.sleep(REJOIN_GRACE_S)
        rounds.finish.set()
    assert rounds.groups == [sorted([ME, A, B]), sorted([ME, A])] and out[0][2] == sorted([ME, A])
    assert rg.alive([ME, A, B], dict(rg.forgotten)) == sorted([ME, A, B])  # the next iteration's rounds: B is in


@pytest.mark.trio
async def test_a_round_waits_for_a_member_presumed_dead_just_before(autojump_clock: trio.testing.MockClock) -> None:
    rg, rounds, out = _regroup(), Rounds(), []
    async with trio.open_nursery() as nursery:
        _presume_dead(rg, B, nursery)  # shortly before BEGIN came: the other members did not notice
        await trio.sleep(2.0)

        nursery.start_soon(_reduce, rg, rounds, out)
        await trio.sleep(3.0)
        assert rounds.groups == []  # waiting for B, up to the grace
        _back(rg, B, incarnation=7)
        await trio.sleep(1.0)
        rounds.finish.set()
    assert rounds.groups == [sorted([ME, A, B])]


@pytest.mark.trio
async def test_a_round_starts_without_a_member_dead_for_longer(autojump_clock: trio.testing.MockClock) -> None:
    rg, rounds = _regroup(), Rounds()
    async with trio.open_nursery() as nursery:
        _presume_dead(rg, B, nursery)
        await trio.sleep(REJOIN_GRACE_S + 1.0)
        t0 = trio.current_time()
        nursery.start_soon(rg.all_reduce, "s0/it3", [ME, A, B], rounds.run_round)
        await trio.sleep(0.5)
        rounds.finish.set()
    assert rounds.groups == [sorted([ME, A])] and trio.current_time() - t0 < 1.0


@pytest.mark.trio
async def test_a_failed_group_is_tried_again_only_after_a_wait(autojump_clock: trio.testing.MockClock) -> None:
    from gwtf_node.runtime.node.allreduce import AllReduceError

    rg, groups, t = _regroup(), [], []

    async def run_round(gkey: str, group: list[str]):
        groups.append(group)
        t.append(trio.current_time())
        raise AllReduceError("timed out")

    result, gkey, group = await rg.all_reduce("s0/it3", [ME, A, B], run_round)
    assert groups == [sorted([ME, A, B])] and group == [ME] and gkey == "s0/it3/alone" and result is None
    assert trio.current_time() - t[0] >= GROUP_CHANGE_WAIT_S


@pytest.mark.trio
async def test_a_named_member_not_heard_of_yet_is_waited_for(autojump_clock: trio.testing.MockClock) -> None:
    """BEGIN names a stage-mate whose Hello has not come yet (a swarm whose flows formed fast): the round waits
    for it up to the grace, so that every member sums in the same group."""
    rg, rounds, out = _regroup(), Rounds(), []
    rg.peers.forget(B)  # (never heard of: not in the registry, and not forgotten by the regroup)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reduce, rg, rounds, out)
        await trio.sleep(REJOIN_GRACE_S / 3)
        assert rounds.groups == []  # waiting for B
        rg.peers.upsert(PeerInfo(B, "relay", 0, name="r0_2", incarnation=7), trio.current_time())
        await trio.sleep(1.0)
        rounds.finish.set()
    (result, gkey, group), = out
    assert rounds.groups == [sorted([ME, A, B])] and result == ("sum", 3)


@pytest.mark.trio
async def test_a_named_member_never_heard_of_is_left_out_after_the_grace(autojump_clock: trio.testing.MockClock):
    rg, rounds, out = _regroup(), Rounds(), []
    rg.peers.forget(B)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reduce, rg, rounds, out)
        await trio.sleep(REJOIN_GRACE_S + 1.0)
        rounds.finish.set()
    (result, gkey, group), = out
    assert rounds.groups == [sorted([ME, A])] and result == ("sum", 2)
