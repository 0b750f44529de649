"""The voter set of the election (protocol/leader.py "Voter set", protocol/voters.py): witnesses, changes, leases.

Two data nodes plus relays that may be chosen as witnesses run in the
simulator; `Net` (on tests/support/leadernet.py) drops, loses and duplicates messages,
crashes and restarts machines (a restarted one is restored from what it
persisted) and checks after *every* event that no two nodes act as leader at
once (a crashed incarnation counts until its lease ends) and that no term has
two leaders.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.leader import LeaderConfig, LeaderMachine, Role
from gwtf_node.protocol.messages import HeartbeatAck, LeaderHeartbeat, RequestVote, Vote
from gwtf_node.protocol.voters import LEASE_RTT_FACTOR, VoterSet, lease_for_rtts, next_change, witnesses_needed
from gwtf_node.sim.engine import Simulator

from support.leadernet import ET_S, HB_S, LEASE_S, LeaderNet, Wrapped, elect, takeover_bound_s

GONE_S = 10.0  # the voter timeout of these runs (shorter than the daemon's, to keep runs short)


class Net(LeaderNet):
    """Data nodes d0.. and relays r0.. that may be chosen as witnesses; crashes and restarts."""

    def __init__(self, n_data: int, n_relays: int, seed: int, loss: float = 0.0, dup: float = 0.0) -> None:
        self.data = [f"d{i}" for i in range(n_data)]
        self.relays = [f"r{i}" for i in range(n_relays)]
        self.everyone = self.data + self.relays
        super().__init__(self.everyone, seed, loss, dup)
        self.incarnation: dict[str, int] = {}
        for nid in self.everyone:
            self.sim.add(nid, Wrapped(self, nid))
            self.machines[nid] = self._machine(nid, None)

    def _machine(self, nid: str, saved: dict | None) -> LeaderMachine:
        cfg = LeaderConfig(nid, tuple(self.data), (), LEASE_S, ET_S, HB_S, witness=nid in self.relays,
                           voter_gone_s=GONE_S)
        k = self.incarnation[nid] = self.incarnation.get(nid, -1) + 1
        rng = random.Random(f"{self.seed}/{nid}/{k}")
        m = LeaderMachine.restore(cfg, rng, saved) if saved is not None else LeaderMachine(cfg, rng)
        for r in self.relays:
            m.add_relay(r)  # every admitted relay is known (their Hellos)
        return m

    def kill(self, nid: str) -> None:
        self.sim.kill(nid)

    def restart(self, nid: str) -> None:
        """A crashed node comes back from its state directory (what it persisted before each message)."""
        old = self.machines[nid]
        self.ghosts.append(old)
        self.machines[nid] = self._machine(nid, old.persistent_state())
        self.sim.dead.discard(nid)
        self.sim._apply(nid, self.sim.machines[nid].start(self.sim.now))


# ---- witnesses --------------------------------------------------------------


def test_two_data_nodes_take_the_lowest_relay_as_witness() -> None:
    net = Net(2, 3, seed=1)
    leader = elect(net)
    for nid in ("d0", "d1", "r0"):  # the voters; r1 and r2 are not in the set and hear nothing
        m = net.machines[nid]
        assert m.data == {"d0", "d1"} and m.cur.witnesses == {"r0"}, nid
    assert net.machines[leader].committed() and net.machines[leader].quorum == 2
    assert all(m.role is Role.FOLLOWER for n, m in net.machines.items() if n.startswith("r"))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("victim", ["leader", "other"])
def test_two_data_nodes_survive_losing_either(seed: int, victim: str) -> None:
    net = Net(2, 2, seed)
    leader = elect(net)
    t0 = 20.0 + seed * 0.137
    net.run(t0)
    other = next(d for d in net.data if d != leader)
    dead = leader if victim == "leader" else other
    net.kill(dead)
    if victim == "leader":
        net.run(t0 + 20.0)
        new_at = net.first_acting_after(t0, exclude=leader)
        assert new_at is not None and new_at <= t0 + takeover_bound_s(2), f"seed {seed}: took over at {new_at}"
    else:  # the leader's lease never lapses: the witness and the leader are a quorum of 3
        for k in range(40):
            net.run(t0 + 0.5 * k)
            assert net.acting() == leader, f"seed {seed}: leader not acting at {net.sim.now:.2f}"
    survivor = other if victim == "leader" else leader
    net.run(t0 + 3 * GONE_S)  # the dead data node is removed, then the witness it no longer needs
    assert net.acting() == survivor
    assert net.machines[survivor].voters == {survivor}
    net.restart(dead)  # it comes back (the same id): added again, and a witness with it
    net.run(t0 + 3 * GONE_S + 15.0)
    assert net.acting() == survivor and net.machines[survivor].voters == {"d0", "d1", "r0"}
    net.kill(survivor)  # and the run again survives losing a data node
    net.run(net.sim.now + takeover_bound_s(2))
    assert net.acting() == dead


def test_a_dead_witness_is_replaced_by_the_next_relay() -> None:
    net = Net(2, 3, seed=4)
    leader = elect(net)
    net.kill("r0")
    net.run(20.0 + 2 * GONE_S)
    assert net.machines[leader].cur.witnesses == {"r1"}
    assert net.acting() == leader
    other = next(d for d in net.data if d != leader)
    net.kill(leader)
    net.run(net.sim.now + takeover_bound_s(2))
    assert net.acting() == other


def test_goodbye_removes_a_voter_at_once() -> None:
    net = Net(3, 1, seed=5)
    leader = elect(net)
    other = sorted(set(net.data) - {leader})[0]
    net.machines[leader].voter_left(other)
    net.kill(other)
    net.run(net.sim.now + 2.0)  # a few heartbeats, far below GONE_S
    assert other not in net.machines[leader].voters
    # two data nodes remain: they take the relay as witness
    assert net.machines[leader].voters == set(net.data) - {other} | {"r0"}


def test_a_restarted_witness_does_not_vote_twice_in_a_term() -> None:
    cfg = LeaderConfig("r0", ("d0", "d1"), (), witness=True)
    w = LeaderMachine(cfg, random.Random(0))
    w.start(0.0)
    out = w.on_message(5.0, "d0", RequestVote(3, False, 5.0))
    assert [e.msg.granted for e in out if type(e) is Send] == [True]
    again = LeaderMachine.restore(cfg, random.Random(1), w.persistent_state())
    again.start(5.5)
    out = again.on_message(9.0, "d1", RequestVote(3, False, 9.0))  # after any promise: still one vote in term 3
    assert [e.msg for e in out if type(e) is Send] == [Vote(3, False, False, 9.0)]
    assert again.on_timer(20.0, "leader.election") == [] and again.role is Role.FOLLOWER  # never stands


def test_a_witness_never_stands_and_a_relay_cannot_be_voted_for() -> None:
    w = LeaderMachine(LeaderConfig("r0", ("d0", "d1"), (), witness=True), random.Random(0))
    assert all(type(e) is not Send for e in w.start(0.0) + w.on_timer(50.0, "leader.election"))
    d = LeaderMachine(LeaderConfig("d0", ("d0", "d1"), ("r0",)), random.Random(0))
    d.start(0.0)
    out = d.on_message(10.0, "r0", RequestVote(1, False, 10.0))
    assert [e.msg.granted for e in out if type(e) is Send] == [False]


# ---- changes of the voter set ---------------------------------------------------


def test_a_candidate_with_an_older_voter_set_is_refused() -> None:
    m = LeaderMachine(LeaderConfig("b", ("a", "b", "c")), random.Random(0))
    m.start(0.0)
    m.on_message(3.0, "a", LeaderHeartbeat(4, 3.0, ("a", "b", "c"), (), cfg_version=2))
    assert m.cur.stamp == (4, 2)
    for stamp, granted in [((4, 1), False), ((3, 9), False), ((4, 2), True), ((5, 0), True)]:
        out = m.on_message(10.0, "c", RequestVote(5, True, 10.0, *stamp))
        assert [e.msg.granted for e in out if type(e) is Send] == [granted], stamp
    # an older heartbeat of the same term does not take the set back
    m.on_message(10.5, "a", LeaderHeartbeat(4, 2.0, ("a", "b"), (), cfg_version=1))
    assert m.cur.stamp == (4, 2) and m.data == {"a", "b", "c"}


def test_next_change_is_one_voter_at_a_time() -> None:
    cur = VoterSet(frozenset({"d0", "d1"}), frozenset())
    assert next_change(cur, "d0", {"d0", "d1"}, {"r2", "r1"}, (), ()) == ({"d0", "d1"}, {"r1"})
    cur = VoterSet(frozenset({"d0", "d1"}), frozenset({"r1"}))
    assert next_change(cur, "d0", {"d0", "d1"}, {"r1"}, (), ()) is None
    assert next_change(cur, "d0", {"d0", "d1", "d2"}, {"r1"}, (), ()) == ({"d0", "d1", "d2"}, {"r1"})
    cur3 = VoterSet(frozenset({"d0", "d1", "d2"}), frozenset({"r1"}))
    assert next_change(cur3, "d0", {"d0", "d1", "d2"}, {"r1"}, (), ()) == ({"d0", "d1", "d2"}, frozenset())
    assert next_change(cur, "d0", {"d0", "d1"}, {"r1"}, (), {"d1", "d0"}) == ({"d0"}, {"r1"})  # never itself
    assert next_change(cur, "d0", {"d0", "d1"}, {"r1", "r2"}, {"r1"}, ()) == ({"d0", "d1"}, frozenset())
    assert [witnesses_needed(n) for n in range(1, 5)] == [0, 1, 0, 0]


def test_every_change_differs_by_one_voter_and_waits_for_the_last() -> None:
    """Along a run with data nodes and relays coming and going, the leader's voter sets form a chain of
    one-voter steps, each made only once a quorum of the previous one acknowledged it (`committed`)."""
    net = Net(3, 3, seed=11)
    leader = elect(net)
    m = net.machines[leader]
    seen = [m.cur]
    t = net.sim.now
    for step, (kind, nid) in enumerate([("kill", "r0"), ("kill", sorted(set(net.data) - {leader})[0]),
                                        ("kill", "r1"), ("restart", "r0")]):
        getattr(net, kind)(nid)
        for _ in range(200):
            t += 0.2
            net.run(t)
            if m.cur != seen[-1]:
                assert len(m.cur.voters ^ seen[-1].voters) == 1, (seen[-1], m.cur)
                seen.append(m.cur)
    assert len(seen) >= 4 and net.acting() == leader


# ---- leases sized from round trips ---------------------------------------------


def test_lease_for_rtts() -> None:
    rtts = {"b": 0.4, "c": 0.05, "d": 1.0}
    assert lease_for_rtts(rtts, ["a", "b", "c"], "a", 2.0, 30.0) == 2.0  # 8 x 0.05 is below the floor
    assert lease_for_rtts(rtts, ["a", "b", "d"], "a", 2.0, 30.0) == pytest.approx(LEASE_RTT_FACTOR * 0.4)
    assert lease_for_rtts(rtts, ["a", "b", "c", "d", "e"], "a", 2.0, 30.0) == pytest.approx(LEASE_RTT_FACTOR * 0.4)
    assert lease_for_rtts({"d": 9.0}, ["a", "d"], "a", 2.0, 30.0) == 30.0
    assert lease_for_rtts({}, ["a", "b", "c"], "a", 2.0, 30.0) == 2.0  # unmeasured: the floor


def test_a_longer_lease_is_asked_promised_and_bounded() -> None:
    d = LeaderMachine(LeaderConfig("d0", ("d0",)), random.Random(0))
    d.set_lease(6.0)
    out = d.start(0.0) + d.on_timer(5.0, "leader.election")
    assert d.is_leader(5.0) and d.lease_end == pytest.approx(5.0 + 6.0 * (1 - 2 * d.cfg.max_clock_drift))
    (timer,) = [e for e in out if getattr(e, "key", "") == "leader.heartbeat"]
    assert timer.deadline == pytest.approx(5.0 + 0.5 * 6.0 / 2.0)  # heartbeats spaced with the lease
    d.set_lease(1e9)
    assert d.lease_s == d.cfg.max_lease_s
    v = LeaderMachine(LeaderConfig("b", ("a", "b", "c")), random.Random(0))
    v.start(0.0)
    v.on_message(3.0, "a", LeaderHeartbeat(1, 3.0, ("a", "b", "c"), lease_s=7.0))
    assert v.promise_until == pytest.approx(10.0) and v.persistent_state()["promised_s"] == 7.0
    out = v.on_message(3.0, "a", LeaderHeartbeat(1, 3.1, ("a", "b", "c"), lease_s=math.inf))
    assert [e.msg for e in out if type(e) is Send] == [HeartbeatAck(1, 3.1, False)]
    again = LeaderMachine.restore(v.cfg, random.Random(0), v.persistent_state())
    again.start(20.0)
    assert again.promise_until == pytest.approx(27.0)  # a restart honours the longest promise it gave


def test_leases_from_slow_links_keep_a_leader() -> None:
    """Round trips near the lease floor: with leases sized from them the leader keeps its lease."""
    net = Net(2, 1, seed=3)
    slow = {(a, b): 0.9 for a in net.everyone for b in net.everyone}
    net.sim = Simulator(lambda a, b: slow.get((a, b)))
    for nid in net.everyone:
        net.sim.add(nid, Wrapped(net, nid))
        net.machines[nid].set_lease(lease_for_rtts({p: 1.8 for p in net.everyone}, net.everyone, nid, 2.0, 30.0))
    leader = elect(net, until=60.0)
    for k in range(40):
        net.run(60.0 + k)
        assert net.acting() == leader


# ---- property: random schedules ------------------------------------------------------------

events = st.lists(
    st.tuples(st.sampled_from(["crash", "restart", "partition", "heal"]), st.floats(0.2, 8.0),
              st.integers(0, 2**16)),
    min_size=1, max_size=10,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), shape=st.sampled_from([(2, 1), (2, 3), (3, 1), (4, 2)]), plan=events,
       loss=st.sampled_from([0.0, 0.1]), dup=st.sampled_from([0.0, 0.1]))
def test_random_schedules_keep_one_leader_and_recover(seed: int, shape: tuple, plan: list, loss: float,
                                                      dup: float) -> None:
    """Crashes and restarts of data nodes and witnesses, partitions, lost and duplicated messages: never two
    leaders at once (checked at every event); once every node is back and connected, a leader acts again."""
    net = Net(*shape, seed, loss=loss, dup=dup)
    net.sim.start_all()
    t = 2.0
    for kind, dt, k in plan:
        t += dt
        net.run(t)
        r = random.Random(k)
        if kind == "crash":
            net.kill(r.choice(net.everyone))
        elif kind == "restart" and net.sim.dead:
            net.restart(r.choice(sorted(net.sim.dead)))
        elif kind == "partition":
            side = set(r.sample(net.everyone, r.randint(1, len(net.everyone) - 1)))
            net.partition(side, set(net.everyone) - side)
        else:
            net.heal()
    net.heal()
    net.loss = net.dup = 0.0
    for nid in sorted(net.sim.dead):
        net.restart(nid)
    net.run(t + 40.0)
    assert net.acting() is not None, f"seed {seed}, {shape}, plan {plan}: no leader 40 s after healing"


def test_a_change_waits_until_a_quorum_acknowledged_the_set_in_the_leaders_term() -> None:
    """Raft's fix of single-server changes: a new leader first commits its own term's set (the no-op), and
    each change waits for the previous one."""
    m = LeaderMachine(LeaderConfig("d0", ("d0", "d1", "d2")), random.Random(0))
    m.start(0.0)
    m.add_data_node("d3")
    m.on_timer(3.0, "leader.election")  # pre-vote
    m.on_message(3.01, "d1", Vote(1, True, True, 3.0))
    m.on_message(3.02, "d1", Vote(1, False, True, 3.01))
    assert m.is_leader(3.02) and m.cur.stamp == (1, 0)

    def beat(t: float) -> LeaderHeartbeat:
        (hb,) = {e.msg for e in m.on_timer(t, "leader.heartbeat") if type(e) is Send}
        return hb

    assert beat(3.5).cfg_version == 0  # only the leader itself holds (1, 0): no change yet
    m.on_message(3.6, "d1", HeartbeatAck(1, 3.02, True))  # d1 acknowledges the term's first heartbeat
    hb = beat(4.0)
    assert hb.cfg_version == 1 and set(hb.data_nodes) == {"d0", "d1", "d2", "d3"}
    m.add_relay("r0")
    m.voter_left("d2")
    assert beat(4.5).cfg_version == 1  # version 1 not acknowledged by a quorum of its 4 voters yet
    m.on_message(4.6, "d1", HeartbeatAck(1, 4.0, True))
    assert beat(5.0).cfg_version == 1  # 2 of 4
    m.on_message(5.1, "d3", HeartbeatAck(1, 4.0, True))
    hb = beat(5.5)
    assert hb.cfg_version == 2 and set(hb.data_nodes) == {"d0", "d1", "d3"} and hb.witnesses == ()
