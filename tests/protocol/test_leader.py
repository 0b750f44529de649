"""Leader election (protocol/leader.py) in the simulator: crashes, partitions, the bound.

Every machine is wrapped by `Net` (tests/support/leadernet.py), which drops messages across a partition
(at send and at delivery) and checks the safety invariants after *every*
event of the run: at most one node acting as leader at any instant, and never
two nodes acting as leader of the same term.  Runs are pure functions of
their seed; a failing case prints it.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.leader import LeaderConfig, LeaderMachine, Role
from gwtf_node.protocol.messages import HeartbeatAck, LeaderHeartbeat, RequestVote, Vote

from support.leadernet import ET_S, HB_S, LEASE_S, MAX_DELAY_S, LeaderNet, Wrapped, elect, takeover_bound_s


class Net(LeaderNet):
    """Data nodes d0.. (and witnesses w0..), every one a voter from the start."""

    def __init__(self, n: int, seed: int, witnesses: int = 0) -> None:
        self.ids = [f"d{i}" for i in range(n)]
        self.witness_ids = [f"w{i}" for i in range(witnesses)]
        super().__init__(self.ids + self.witness_ids, seed)
        for nid in self.ids + self.witness_ids:
            self.add(nid, seed)

    def add(self, nid: str, seed: int, data_nodes: tuple[str, ...] | None = None) -> LeaderMachine:
        cfg = LeaderConfig(nid, tuple(data_nodes or self.ids), tuple(self.witness_ids), LEASE_S, ET_S, HB_S)
        m = LeaderMachine(cfg, random.Random(f"{seed}/{nid}"))
        self.machines[nid] = m
        self.sim.add(nid, Wrapped(self, nid))
        return m


# ---- election and stability -------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_one_leader_is_elected_and_stays(n: int) -> None:
    net = Net(n, seed=1)
    leader = elect(net)
    term = net.machines[leader].term
    net.run(60.0)
    assert net.acting() == leader and net.machines[leader].term == term
    assert all(m.leader(net.sim.now) == leader for m in net.machines.values())
    assert all(m.term == term for m in net.machines.values())


def test_config_is_validated_with_numbers() -> None:
    with pytest.raises(ValueError, match="lease_s <= low"):
        LeaderConfig("a", ("a",), lease_s=3.0, election_timeout_s=(2.5, 4.0))
    with pytest.raises(ValueError, match="heartbeat_s is 3"):
        LeaderConfig("a", ("a",), heartbeat_s=3.0)
    with pytest.raises(ValueError, match="neither a data node nor a witness"):
        LeaderMachine(LeaderConfig("x", ("a",)), random.Random(0))


# ---- the leader crashes -----------------------------------------------------


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("seed", range(6))
def test_leader_crash_new_leader_within_bound(n: int, seed: int) -> None:
    net = Net(n, seed)
    old = elect(net)
    t0 = 20.0 + seed * 0.137  # mid-heartbeat, not aligned with anything
    net.run(t0)
    net.sim.kill(old)
    net.run(t0 + 30.0)
    new_at = net.first_acting_after(t0, exclude=old)
    assert new_at is not None, f"seed {seed}: no new leader after {old} crashed"
    terms_used = net.machines[net.acting()].term - net.machines[old].term
    bound = t0 + takeover_bound_s() + (terms_used - 1) * (ET_S[1] + 4 * MAX_DELAY_S)
    assert new_at <= bound, f"seed {seed}: new leader at {new_at:.3f}, bound {bound:.3f}"
    assert terms_used <= 2, f"seed {seed}: {terms_used} terms to elect a leader"


def test_leader_crash_first_round_usually_succeeds() -> None:
    """The single-round bound holds in most runs (a split vote needs two candidates within 4 delta)."""
    late = 0
    for seed in range(20):
        net = Net(5, seed)
        old = elect(net)
        net.run(20.0)
        net.sim.kill(old)
        net.run(50.0)
        new_at = net.first_acting_after(20.0, exclude=old)
        assert new_at is not None
        late += new_at > 20.0 + takeover_bound_s()
    assert late <= 2


def test_cut_off_leader_stops_acting_and_majority_takes_over() -> None:
    net = Net(5, seed=3)
    old = elect(net)
    t0 = 20.0
    net.run(t0)
    rest = set(net.ids) - {old}
    net.partition({old}, rest)
    net.run(t0 + 30.0)
    assert net.machines[old].role is Role.LEADER and not net.machines[old].is_leader(net.sim.now)
    new = net.acting()
    assert new in rest
    assert net.first_acting_after(t0, exclude=old) <= t0 + takeover_bound_s() + ET_S[1] + 4 * MAX_DELAY_S
    net.heal()
    net.run(t0 + 40.0)
    assert net.acting() == new  # the old leader rejoins as a follower
    assert net.machines[old].leader(net.sim.now) == new


# ---- partitions -------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_partitions_of_three_never_yield_two_leaders(seed: int) -> None:
    net = Net(3, seed)
    leader = elect(net)
    others = sorted(set(net.ids) - {leader})
    plan = [({leader}, set(others)), ({leader, others[0]}, {others[1]}), (set(net.ids),),
            ({others[0]}, {leader}, {others[1]})]
    t = 15.0
    for groups in plan:
        net.partition(*groups)
        t += 12.0
        net.run(t)
        majority = [g for g in groups if len(g) >= 2]
        acting = net.acting()
        if majority:
            assert acting in majority[0], f"seed {seed}: {groups} -> acting {acting}"
        else:
            assert acting is None  # nobody holds a quorum
    net.heal()
    net.run(t + 15.0)
    assert net.acting() is not None


@pytest.mark.parametrize("seed", range(4))
def test_partitions_of_five_never_yield_two_leaders(seed: int) -> None:
    net = Net(5, seed)
    elect(net)
    rng = random.Random(seed)
    t = 15.0
    for _ in range(6):
        shuffled = rng.sample(net.ids, len(net.ids))
        cut = rng.randint(1, 4)
        groups = (set(shuffled[:cut]), set(shuffled[cut:]))
        net.partition(*groups)
        t += rng.uniform(1.0, 12.0)
        net.run(t)
        if rng.random() < 0.3:
            net.heal()
            t += rng.uniform(1.0, 12.0)
            net.run(t)
    net.heal()
    net.run(t + 15.0)
    assert net.acting() is not None


@pytest.mark.parametrize("n", [3, 5])
def test_non_transitive_partition_waits_for_the_lease(n: int) -> None:
    """The leader loses its link to one follower only: that follower runs, but the others are
    bound by their promise to the leader, so nobody else acts while the leader's lease holds."""
    net = Net(n, seed=9)
    leader = elect(net)
    lone = sorted(set(net.ids) - {leader})[0]
    net.cut_links = {frozenset((leader, lone))}
    net.run(60.0)  # every event checked: never two acting
    assert net.acting() is not None


def test_two_data_nodes_partitioned_have_no_leader_then_recover() -> None:
    """Documented in leader.py: with 2 voters a partition leaves nobody acting (safe, not live)."""
    net = Net(2, seed=5)
    leader = elect(net)
    net.partition({"d0"}, {"d1"})
    net.run(15.0 + LEASE_S)
    assert net.acting() is None
    net.run(40.0)
    assert net.acting() is None
    assert net.machines[leader].term == net.machines["d0"].term == net.machines["d1"].term  # pre-votes only
    net.heal()
    net.run(55.0)
    assert net.acting() is not None


def test_two_data_nodes_with_a_witness_survive_a_crash() -> None:
    net = Net(2, seed=6, witnesses=1)
    leader = elect(net)
    net.run(20.0)
    net.sim.kill(leader)
    net.run(20.0 + takeover_bound_s() + ET_S[1])
    (other,) = set(net.ids) - {leader}
    assert net.acting() == other
    assert not net.machines["w0"].is_leader(net.sim.now) and net.machines["w0"].role is Role.FOLLOWER


def test_isolated_follower_does_not_inflate_its_term_nor_depose_the_leader() -> None:
    net = Net(5, seed=7)
    leader = elect(net)
    term = net.machines[leader].term
    lone = sorted(set(net.ids) - {leader})[0]
    net.partition({lone}, set(net.ids) - {lone})
    net.run(60.0)
    assert net.machines[lone].term == term
    net.heal()
    net.run(70.0)
    assert net.acting() == leader and net.machines[leader].term == term
    assert net.machines[lone].leader(net.sim.now) == leader


def test_a_data_node_that_joins_later_votes_and_can_lead() -> None:
    net = Net(3, seed=8)
    old = elect(net)
    for m in net.machines.values():
        m.add_data_node("d3")
    late = net.add("d3", 8, data_nodes=("d0", "d1", "d2", "d3"))
    net.sim._apply("d3", late.start(net.sim.now))  # a node added to a running simulator
    net.run(30.0)
    assert late.leader(net.sim.now) == old
    assert net.machines[old].quorum == 3
    net.sim.kill(old)
    net.run(60.0)
    assert net.acting() not in (None, old)


# ---- message-level details --------------------------------------------------


def test_a_promise_blocks_votes_for_others_until_it_ends() -> None:
    cfg = LeaderConfig("b", ("a", "b", "c"))
    m = LeaderMachine(cfg, random.Random(0))
    m.start(0.0)
    m.on_message(3.0, "a", LeaderHeartbeat(term=1, sent_at=3.0, data_nodes=("a", "b", "c")))
    (reply,) = [e for e in m.on_message(4.0, "c", RequestVote(term=2, pre=False, sent_at=4.0)) if type(e) is Send]
    assert reply.msg == Vote(term=1, pre=False, granted=False, sent_at=4.0)
    assert m.term == 1  # not adopted while the promise holds
    # a candidate whose voter set is older than the one b took from a's heartbeat (term 1) is refused
    (reply,) = [e for e in m.on_message(5.0, "c", RequestVote(term=2, pre=False, sent_at=5.0)) if type(e) is Send]
    assert reply.msg == Vote(term=1, pre=False, granted=False, sent_at=5.0)
    (reply,) = [e for e in m.on_message(5.0, "c", RequestVote(2, False, 5.0, cfg_term=1)) if type(e) is Send]
    assert reply.msg == Vote(term=2, pre=False, granted=True, sent_at=5.0)
    # a stale heartbeat is refused, with the current term
    (reply,) = [e for e in m.on_message(5.1, "a", LeaderHeartbeat(1, 5.1, ("a", "b", "c"))) if type(e) is Send]
    assert reply.msg == HeartbeatAck(term=2, sent_at=5.1, ok=False)


def test_restart_refuses_votes_for_a_lease() -> None:
    m = LeaderMachine(LeaderConfig("b", ("a", "b", "c")), random.Random(0), term=4, voted_for="a")
    m.start(100.0)
    out = m.on_message(100.5, "c", RequestVote(term=5, pre=True, sent_at=100.5))
    assert out == [Send("c", Vote(term=4, pre=True, granted=False, sent_at=100.5))]
    out = m.on_message(102.0, "c", RequestVote(term=5, pre=True, sent_at=102.0))
    assert out == [Send("c", Vote(term=5, pre=True, granted=True, sent_at=102.0))]


# ---- property: random crash and partition schedules -------------------------

events = st.lists(
    st.tuples(st.sampled_from(["crash", "partition", "heal"]), st.floats(0.2, 8.0), st.integers(0, 2**16)),
    min_size=1, max_size=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), n=st.sampled_from([3, 4, 5]), plan=events)
def test_random_schedules_keep_one_leader_and_recover(seed: int, n: int, plan: list) -> None:
    net = Net(n, seed)
    net.sim.start_all()
    t = 2.0
    quorum = n // 2 + 1
    for kind, dt, k in plan:
        t += dt
        net.run(t)
        alive = [x for x in net.ids if x not in net.sim.dead]
        if kind == "crash" and len(alive) > quorum:
            net.sim.kill(alive[k % len(alive)])
        elif kind == "partition" and k % 3 == 0:
            r = random.Random(k)
            net.cut_links |= {frozenset(r.sample(net.ids, 2)) for _ in range(r.randint(1, n))}
        elif kind == "partition":
            r = random.Random(k)
            side = set(r.sample(net.ids, r.randint(1, n - 1)))
            net.partition(side, set(net.ids) - side)
        else:
            net.heal()
    net.heal()
    net.run(t + 40.0)
    # a quorum is alive and connected: a leader acts again (and never two: checked at every event)
    assert net.acting() is not None, f"seed {seed}, n {n}, plan {plan}: no leader 40 s after healing"
