"""Admission and role checks (runtime/trust/authorize.py): pure tables first, then one hostile member in a real swarm.

The swarm test: a swarm (1 data node, 2 relays, one placed by the leader;
the daemons run as tasks of the test's process, tests/support/inproc.py) trains; a hostile member, admitted by the owner as a relay but placed in no
stage, written with the project's own codec on a libp2p host of its own,
tries the role attacks in turn.  Each is refused with its `RefusalCode`,
read from the victims' status.json ("refused": {code: count}); then the owner
revokes it through the DHT, and the victims refuse its frames as REVOKED.
Every iteration's loss still equals the centralized reference.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gwtf_node.model.certificates import issue_certificate, public_key_hex
from gwtf_node.model.manifest import RunManifest, default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.protocol.bounds import MAX_TERM_AHEAD
from gwtf_node.runtime.trust.authorize import Authorizer, Needs, Snapshot, decide
from gwtf_node.runtime.net.host import PeerUnreachable, open_host
from gwtf_node.runtime.net.peers import PeerInfo
from gwtf_node.runtime.trust.records import seal, key_pair_of
from gwtf_node.runtime.net.wire import RefusalTracker
from gwtf_node.runtime.node.driver import Drivers

from support.inproc import in_process_swarm
from support.swarmutil import assert_losses, order_horizon, status, wait_for

R = m.RefusalCode
DEADLINE_S = 400
D0, D1, R0, R1, R2, NEW = "d0", "d1", "r0", "r1", "r2", "new"
INFO = {D0: PeerInfo(D0, "data", -1), D1: PeerInfo(D1, "data", -1), R0: PeerInfo(R0, "relay", 0),
        R1: PeerInfo(R1, "relay", 1), R2: PeerInfo(R2, "relay", 2), NEW: PeerInfo(NEW, "relay", -2)}


def _code(needs: Needs, msg, sender: str, *, me=("relay", 1), leader=D0, term=3, begun=()):
    snap = Snapshot(me[0], me[1], 3, leader, term, begun)
    r = decide(needs, msg, INFO[sender], snap)
    return None if r is None else r.code


def test_role_table() -> None:
    hb = m.LeaderHeartbeat(3, 0.0, (D0, D1))
    assert _code(Needs.LEADER, hb, R0, me=("data", -1)) is R.WRONG_ROLE  # a relay takes no leadership
    assert _code(Needs.LEADER, m.LeaderHeartbeat(99, 0.0, ()), R0, me=("data", -1)) is R.WRONG_ROLE
    assert _code(Needs.LEADER, hb, D1, me=("data", -1)) is R.NOT_LEADER  # term 3 is D0's
    assert _code(Needs.LEADER, hb, D0, me=("data", -1)) is None
    assert _code(Needs.LEADER, m.LeaderHeartbeat(4, 0.0, ()), D1, me=("data", -1)) is None  # a new term: Raft
    assert _code(Needs.LEADER, m.LeaderHeartbeat(2, 0.0, ()), D1, me=("data", -1)) is None  # the machine says no
    assert _code(Needs.LEADER, hb, D1, me=("data", -1), leader=None) is None  # who won term 3 is not known here
    assert _code(Needs.DATA, m.Lend(0, R0), NEW, me=("data", -1)) is R.WRONG_ROLE
    assert _code(Needs.DATA, m.IterationDone(0, 1, 1.0), D1, me=("data", -1)) is None
    assert _code(Needs.DATA, m.RequestVote(9, False, 0.0), D1, me=("data", -1)) is None  # anyone may run
    a = m.Assignment(3, NEW, 0, R0, 5)
    assert _code(Needs.LEADER, a, R0, me=("relay", None)) is R.NOT_LEADER
    assert _code(Needs.LEADER, a, D1, me=("relay", None)) is R.NOT_LEADER
    assert _code(Needs.LEADER, a, D0, me=("relay", None)) is None
    assert _code(Needs.LEADER, m.Assignment(2, NEW, 0, R0, 5), D0, me=("relay", None)) is R.NOT_LEADER  # stale
    assert _code(Needs.LEADER, m.Assignment(4, NEW, 0, R0, 5), D1, me=("relay", None)) is None  # a new term
    assert _code(Needs.LEADER, a, D1, me=("relay", None), leader=None, term=None) is None  # no leader known
    query = m.UtilizationQuery(7, 3)
    assert _code(Needs.LEADER, query, D1, me=("relay", 0)) is R.NOT_LEADER
    assert _code(Needs.LEADER, query, R0, me=("relay", 1)) is R.NOT_LEADER
    assert _code(Needs.LEADER, query, D0, me=("relay", 1)) is None
    begin = m.BeginAggregation(0, 4, term=3)
    assert _code(Needs.UPSTREAM, begin, R0, me=("relay", 1)) is None  # front to back
    assert _code(Needs.UPSTREAM, begin, R2, me=("relay", 1)) is R.NOT_LEADER
    assert _code(Needs.UPSTREAM, begin, NEW, me=("relay", 1)) is R.NOT_LEADER
    assert _code(Needs.UPSTREAM, begin, D0, me=("relay", 0)) is None  # the leader of term 3
    assert _code(Needs.UPSTREAM, begin, D1, me=("relay", 0)) is R.NOT_LEADER  # another data node
    assert _code(Needs.UPSTREAM, begin, D1, me=("data", -1)) is R.NOT_LEADER
    assert _code(Needs.UPSTREAM, begin, D0, me=("data", -1)) is None
    assert _code(Needs.UPSTREAM, m.BeginAggregation(0, 4, term=4), D1, me=("data", -1)) is None  # before its heartbeat
    assert _code(Needs.UPSTREAM, m.BeginAggregation(0, 4, term=2), D0, me=("data", -1)) is R.NOT_LEADER
    assert _code(Needs.UPSTREAM, m.BeginAggregation(0, 4, term=2), D0, me=("relay", 0)) is R.NOT_LEADER  # stale
    assert _code(Needs.UPSTREAM, m.BeginAggregation(0, 4, term=4), D1, me=("relay", 0)) is None  # a new term
    assert _code(Needs.UPSTREAM, begin, R2, me=("data", -1)) is None  # the last stage passes it on
    # a copy of a BEGIN taken already, sent again by another data node to ask for its CAN TAKE: any admitted data
    # node, of the term known or an older one (stamped by the leader that made it); never a relay, a newer term
    # is news as ever, and an iteration not begun here still needs its leader
    assert _code(Needs.UPSTREAM, begin, D1, me=("relay", 0), begun={0}) is None
    assert _code(Needs.UPSTREAM, m.BeginAggregation(0, 4, term=2), D1, me=("relay", 0), begun={0}) is None
    assert _code(Needs.UPSTREAM, m.BeginAggregation(1, 4, term=3), D1, me=("relay", 0), begun={0}) is R.NOT_LEADER
    assert _code(Needs.UPSTREAM, begin, R2, me=("relay", 1), begun={0}) is R.NOT_LEADER
    assert _code(Needs.UPSTREAM, begin, NEW, me=("relay", 1), begun={0}) is R.NOT_LEADER
    relabel = m.Relabel(D0, D1)
    assert _code(Needs.NEIGHBOUR, relabel, R0, me=("relay", 1)) is None
    assert _code(Needs.NEIGHBOUR, relabel, NEW, me=("relay", 1)) is R.NOT_NEIGHBOUR
    assert _code(Needs.NEIGHBOUR, relabel, D0, me=("relay", 1)) is R.NOT_NEIGHBOUR  # two stages away
    assert _code(Needs.NEIGHBOUR, relabel, D0, me=("relay", 2)) is None  # the ring: last stage -> data
    assert decide(Needs.PLACED, relabel, None, Snapshot("relay", 1, 3, None, None)).code is R.UNKNOWN_PEER


class _Peers:
    """What the authorizer reads of the peer table: roles by peer id, this node's place."""

    def __init__(self, role: str, stage: int | None) -> None:
        self.role, self.stage, self.n_stages = role, stage, 3

    def get(self, peer: str) -> PeerInfo | None:
        return INFO.get(peer)


class _DataNodePeers(_Peers):
    """The peer table of data node d0, which knows d0 and d1 as the run's data nodes."""

    name = "d0"

    def data_nodes(self) -> list[str]:
        return [D0, D1]

    def infos(self) -> list:
        return []

    def who(self, peer: str) -> str:
        return peer


@pytest.mark.trio
async def test_a_relay_learns_a_new_term_from_its_leader_first_message_and_refuses_the_old_leader_after() -> None:
    """The race at an election: the new leader's message overtakes the news of its term.  It is taken (and
    the relay learns the term and its leader); the deposed leader's messages are refused from then on."""
    from gwtf_node.runtime.node.leadership import Leadership

    lead = Leadership.__new__(Leadership)  # only the relay's view of who leads (no election: a relay)
    lead.peers, lead.election, lead.known_leader, lead.known_term, lead.known_at = _Peers("relay", 0), None, None, \
        None, None
    auth = Authorizer(run_id="run1", owner_public_key="", open_relays=True)
    refused: list = []
    wire_like = type("W", (), {"post": lambda self, *a: None,
                               "refuse": lambda self, peer, why, code=None: refused.append((peer, code))})()

    def send(peer: str, msg, needs: Needs) -> bool:
        return auth.allow(peer, msg, needs, lead.peers, lead, wire_like)

    assert send(D0, m.UtilizationQuery(1, 3), Needs.LEADER)  # a relay that knew no leader learns D0, term 3
    assert lead.leader_of_term() == (D0, 3)
    assert not send(D1, m.BeginAggregation(5, 4, term=3), Needs.UPSTREAM)  # D1 does not lead term 3
    auth.begun = lambda: {5}  # ... but once iteration 5 began here, D1's copy asks for a CAN TAKE: taken,
    assert send(D1, m.BeginAggregation(5, 4, term=3), Needs.UPSTREAM)  # and D1 is not learned as term 3's leader
    assert lead.leader_of_term() == (D0, 3)
    auth.begun = lambda: ()
    assert send(D1, m.BeginAggregation(5, 4, term=4), Needs.UPSTREAM)  # D1 won term 4: its BEGIN came first
    assert lead.leader_of_term() == (D1, 4)
    assert not send(D0, m.Assignment(3, NEW, 0, R0, 6), Needs.LEADER)  # the deposed leader: stale
    assert not send(D0, m.BeginAggregation(6, 4, term=4), Needs.UPSTREAM)  # ... and it cannot claim term 4
    assert send(D1, m.Assignment(4, NEW, 0, R0, 6), Needs.LEADER)
    assert not send(R1, m.UtilizationQuery(2, 9), Needs.LEADER)  # a relay never leads, whatever its term
    assert lead.leader_of_term() == (D1, 4)
    assert refused == [(D1, R.NOT_LEADER), (D0, R.NOT_LEADER), (D0, R.NOT_LEADER), (R1, R.NOT_LEADER)]
    auth.begun = lambda: {7}  # a BEGIN of an iteration begun here, of a newer term: not a copy, it teaches the term
    assert send(D0, m.BeginAggregation(7, 4, term=5), Needs.UPSTREAM)
    assert lead.leader_of_term() == (D0, 5)


@pytest.mark.trio
async def test_a_data_node_takes_a_new_term_from_a_data_node_and_merges_only_admitted_voters(tmp_path: Path) -> None:
    """A data node's election machine learns a newer term from an admitted data node's heartbeat (Raft), but
    the voter list it carries is filtered to the data nodes admitted here: a stranger listed there is no voter."""
    from types import SimpleNamespace

    from gwtf_node.runtime.node.leadership import Leadership

    wire = SimpleNamespace(me=D0, spawn=lambda *a: None, send=None)
    lead = Leadership(wire, _DataNodePeers("data", -1), None, Drivers(wire), tmp_path, "run1", lambda: 0, lambda: None)
    lead.start()
    assert lead.leader_of_term() == (None, 0)
    auth = Authorizer(run_id="run1", owner_public_key="", open_relays=True)
    hb = m.LeaderHeartbeat(5, 0.0, (D0, D1, "stranger", R0))
    assert auth.check(D1, hb, Needs.LEADER, lead.peers, lead) is None  # a newer term from a data node
    lead.on_leader_msg(D1, hb)
    assert lead.leader_of_term() == (D1, 5)
    assert lead.election.voters == {D0, D1}  # neither the stranger nor the relay votes
    assert auth.check(D0, m.LeaderHeartbeat(5, 0.0, ()), Needs.LEADER, lead.peers, lead).code is R.NOT_LEADER


@pytest.mark.trio
async def test_the_lease_is_sized_from_the_longer_of_a_voters_link_and_liveness_round_trips(tmp_path: Path) -> None:
    """A voter on this machine has its link measured once, in milliseconds; on a machine whose cores are all
    busy its liveness Pings take seconds.  The lease follows the longer measure (8 x 1.5 s), not the link's
    (which leaves the floor of 2 s, shorter than the acknowledgements take)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from gwtf_node.protocol.voters import LEASE_RTT_FACTOR
    from gwtf_node.runtime.node.leadership import Leadership

    class Peers(_DataNodePeers):
        def get(self, peer: str) -> PeerInfo | None:
            info = INFO.get(peer)
            return None if info is None else replace(info, rtt_ms=5.0)  # (the link: measured once, 5 ms)

    leases = {}
    for loaded in (False, True):
        wire = SimpleNamespace(me=D0, spawn=lambda *a: None, send=None)
        lead = Leadership(wire, Peers("data", -1), None, Drivers(wire), tmp_path / str(loaded), "run1", lambda: 0,
                          lambda: None, round_trip_s=lambda peer: 1.5 if loaded and peer == D1 else None)
        lead.start()
        lead._size_lease()
        leases[loaded] = lead.election.lease_s
    assert leases == {False: 2.0, True: pytest.approx(LEASE_RTT_FACTOR * 1.5)}

    # a voter never pinged (two data nodes talk all the time): the round trips of its answers size the lease, a
    # slower one at once, a faster one by an eighth of the difference; an echo of no request of ours is ignored
    from gwtf_node.runtime.node import leadership as ld

    lead = Leadership(wire, Peers("data", -1), None, Drivers(wire), tmp_path / "acks", "run1", lambda: 0,
                      lambda: None)
    lead.start()
    clock = [100.0]
    old_now, ld.now = ld.now, lambda: clock[0]
    try:
        lead.on_leader_msg(D1, m.HeartbeatAck(lead.election.term, 98.5, True))
        lead.on_leader_msg(D1, m.HeartbeatAck(lead.election.term, -1e9, True))
        assert lead.answer_rtt_s == {D1: 1.5}
        lead._size_lease()
        assert lead.election.lease_s == pytest.approx(LEASE_RTT_FACTOR * 1.5)
        lead.on_leader_msg(D1, m.HeartbeatAck(lead.election.term, 99.9, True))
        assert lead.answer_rtt_s[D1] == pytest.approx(1.5 - 1.4 / 8)
    finally:
        ld.now = old_now


def test_admission_by_certificate() -> None:
    owner = Ed25519PrivateKey.generate()
    clock = [1_800_000_000.0]
    a = Authorizer(run_id="run1", owner_public_key=public_key_hex(owner), open_relays=False,
                   clock=lambda: clock[0])
    cert = issue_certificate(owner, "run1", "P", "data", int(clock[0]) + 10).to_bytes()
    hello = m.Hello("run1", "data", -1, "p", 1, (), certificate=cert)
    assert a.check_hello("P", hello) is None
    assert a.check_hello("Q", hello).code is R.BAD_CERTIFICATE  # someone else's certificate
    assert a.check_hello("P", m.Hello("run1", "relay", 0, "p", 1, (), certificate=cert)).code is R.WRONG_ROLE
    assert a.check_hello("P", m.Hello("run1", "data", -1, "p", 1, ())).code is R.NOT_ADMITTED
    assert a.check_hello("P", m.Hello("run1", "relay", 0, "p", 1, ())).code is R.NOT_ADMITTED
    clock[0] += 11
    assert a.check_hello("P", hello).code is R.CERTIFICATE_EXPIRED  # also once it was accepted before
    open_run = Authorizer(run_id="run1", owner_public_key=public_key_hex(owner), open_relays=True)
    assert open_run.check_hello("P", m.Hello("run1", "relay", 0, "p", 1, ())) is None
    assert open_run.check_hello("P", m.Hello("run1", "data", -1, "p", 1, ())).code is R.NOT_ADMITTED
    from gwtf_node.model.certificates import sign_revocations

    dropped = []
    a.on_revoked = dropped.append
    assert a.take_revocations(sign_revocations(owner, "run1", ["P"], 5).to_bytes(), "test") == ["P"]
    assert a.take_revocations(sign_revocations(owner, "run1", [], 4).to_bytes(), "test") == []  # older: ignored
    assert dropped == ["P"] and a.check_revoked("P").code is R.REVOKED
    assert a.check_hello("P", hello).code is R.REVOKED


def test_a_peer_that_keeps_sending_refused_frames_is_banned_for_a_while() -> None:
    t = RefusalTracker(limit=5, window_s=10.0, ban_s=60.0)
    assert not any(t.refused("p", i * 3.0) for i in range(20))  # one every 3 s: a slow trickle, never 5 in 10 s
    assert [t.refused("q", 100 + i * 0.1) for i in range(5)] == [False] * 4 + [True]
    assert t.is_banned("q", 150) and not t.is_banned("q", 160.5) and not t.is_banned("p", 100)


# ---- one swarm and a hostile member ---------------------------------------------------------------


def _refused(tmp_path: Path, name: str) -> dict:
    return status(tmp_path, name).get("refused", {})


@pytest.mark.slow  # (a swarm that trains, in this process: tens of seconds)
@pytest.mark.trio
async def test_a_hostile_member_cannot_take_the_run_over(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    async with in_process_swarm(tmp_path, run, stages=2, relays_per_stage=1, iterations=100000,
                                deadline_s=DEADLINE_S) as swarm:
        assert RunManifest.from_json(run.read_text()).owner_public_key  # the launcher signed the run
        cert = swarm.admit(tmp_path / "evil", "relay").read_bytes()  # a member the owner admitted as a relay
        await swarm.start_node("d0", None)
        boot = swarm.addr("d0")
        async with open_host(tmp_path / "evil", bootstrap=[boot]) as evil:
            me = evil.peer_id

            async def on_frame(peer: str, envelope: bytes, payload) -> None:
                try:
                    _, msg = codec.decode(envelope)
                except codec.DecodeError:
                    return
                if isinstance(msg, m.Ping):  # stay alive in the victims' eyes between attacks
                    try:
                        await evil.send(peer, codec.encode(me, m.Pong(msg.nonce)))
                    except PeerUnreachable:
                        pass  # (a victim that closed its streams to us: the attacks below say what it refuses)

            evil.set_handler(on_frame)

            async def send(peer: str, msg) -> None:
                await evil.send(peer, codec.encode(me, msg))

            # the forged leader record, under a version far above any genuine one, before the relays look
            key = f"run/{swarm.run_id}/leader"
            version = 2 ** 62
            await evil.dht_put(key, seal(key_pair_of(evil), key, version, {"peer_id": me, "term": 10 ** 6}),
                               version=version)
            await swarm.start_node("r1_0", boot)  # --stage 1
            # r0_0 joins with --stage auto: it reads the leader record (and the forgery)
            await swarm.start_node("r0_0", boot, auto=True)
            for name in ("r0_0", "r1_0"):
                await swarm.wait_stage(name)
            await swarm.wait_records(1, 180)
            ids = {n: status(tmp_path, n)["peer_id"] for n in ("d0", "r0_0", "r1_0")}
            stage = {n: status(tmp_path, n)["stage"] for n in ("r0_0", "r1_0")}
            first = min(stage, key=stage.get)
            second = max(stage, key=stage.get)
            d0, r0, r1 = ids["d0"], ids[first], ids[second]
            for victim in (d0, r0, r1):
                await evil.connect((tmp_path / [n for n, p in ids.items() if p == victim][0] / "addr")
                                   .read_text().split()[0])
                await send(victim, m.Hello(swarm.run_id, "relay", -2, "evil", 1, tuple(evil.addrs),
                                           certificate=cert))
            await wait_for(lambda: all(me in status(tmp_path, n).get("peers", {}) for n in ids), 30,
                           "the victims know the hostile member")

            it = len(swarm.records())
            # terms far ahead are refused earlier, by the value bounds (bounds.MAX_TERM_AHEAD, test_hostile_peer.py):
            # these stay within them, so that the role checks are what refuses them
            high = 1 + MAX_TERM_AHEAD // 2
            attacks = [  # (victim name, message, the refusal code expected there)
                ("d0", m.LeaderHeartbeat(high, 0.0, (me,)), R.WRONG_ROLE),
                ("d0", m.BeginAggregation(it, 4), R.NOT_LEADER),
                (second, m.BeginAggregation(it, 4), R.NOT_LEADER),
                (first, m.Assignment(high, me, 0, r0, it + 1), R.NOT_LEADER),
                (first, m.UtilizationQuery(1, high), R.NOT_LEADER),  # it would name itself the leader
                (second, m.Relabel(d0, me), R.NOT_NEIGHBOUR),
                ("d0", m.Lend(it, r0), R.WRONG_ROLE),
                ("d0", m.Hello(swarm.run_id, "data", -1, "evil", 1, tuple(evil.addrs)), R.NOT_ADMITTED),
                ("d0", m.Hello(swarm.run_id, "data", -1, "evil", 1, tuple(evil.addrs), certificate=cert),
                 R.WRONG_ROLE),
            ]
            expected: dict[str, dict[str, int]] = {}
            for victim, msg, code in attacks:
                await send(ids[victim], msg)
                expected.setdefault(victim, {})
                expected[victim][code.name] = expected[victim].get(code.name, 0) + 1
            for victim, codes in expected.items():
                await wait_for(lambda: all(_refused(tmp_path, victim).get(c, 0) >= k for c, k in codes.items()),
                               30, f"{victim} refused {codes}")
            # the joiner read the forged leader record and refused it; the genuine one got it placed
            assert _refused(tmp_path, "r0_0").get("BAD_RECORD", 0) >= 1, _refused(tmp_path, "r0_0")
            assert stage == {"r0_0": 0, "r1_0": 1}
            assert status(tmp_path, "d0")["leader"] == d0 and status(tmp_path, "d0")["term"] < high
            assert all(me not in (status(tmp_path, n).get("flows") or {}) for n in ids)

            # the owner revokes the hostile member through the DHT: every victim drops it and refuses it
            cmd = [sys.executable, "-m", "gwtf_node.cli", "revoke", "--run", str(run), "--peer-id", me,
                   "--publish-to", boot]
            out = await trio.to_thread.run_sync(  # (in a thread: the hostile host keeps answering meanwhile)
                lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=120))
            assert out.returncode == 0, out.stderr
            await wait_for(lambda: all(me in status(tmp_path, n).get("revoked", []) for n in ids), 30,
                           "every node read the revocation list")
            await send(d0, m.Ping(1))
            await wait_for(lambda: _refused(tmp_path, "d0").get("REVOKED", 0) >= 1, 30, "d0 refuses the revoked")
            assert me not in status(tmp_path, "d0")["peers"]
        after = len(swarm.records())
        await swarm.wait_records(after + 1, 120)  # training goes on
    records = swarm.records()
    ref = train_centralized(man, len(records))
    # (the swarm trains as long as the attacks take, 60-210 iterations: equal losses up to where summation order
    # alone shows, every microbatch of every iteration completed)
    horizon = order_horizon(ref.losses, train_centralized(man, len(records), reverse=True).losses)
    assert horizon >= min(len(records), 40), (horizon, len(records))
    assert_losses(records[:horizon], ref.losses[:horizon])
    assert all(r["completed"] == r["microbatches"] == man.data.microbatches_per_iteration and not r["lost"]
               for r in records), [r for r in records if r["completed"] != r["microbatches"] or r["lost"]][:3]
    assert all(status(tmp_path, n).get("insecure_unsigned") is False for n in ("d0", "r0_0", "r1_0"))


def test_a_peer_with_too_many_connections_loses_the_newest() -> None:
    from gwtf_node.runtime.net.limits import ConnectionBound

    class Conn:
        def __init__(self) -> None:
            self.muxed_conn = type("Muxed", (), {"peer_id": "p"})()
            self.closed = False

        async def close(self) -> None:
            self.closed = True

    conns = [Conn() for _ in range(5)]
    net = type("Net", (), {"get_connections": lambda self, peer: conns[:n]})()
    bound = ConnectionBound(limit=4)
    for n in range(1, 6):
        trio.run(bound.connected, net, conns[n - 1])
    assert [c.closed for c in conns] == [False] * 4 + [True] and bound.closed == 1


def test_a_data_node_stamps_the_term_it_led_only_on_the_begins_it_makes_or_hands_on_as_the_leader() -> None:
    """A data node that is not the leader sends the leader's BEGIN again to ask for a CAN TAKE it misses: the copy
    keeps the leader's term (stamped with its own last led term, 0 for a data node that never led, every relay of
    the leader's term refused it, and the data node waited for CAN TAKE until the relays' own resend, 30-50 s an
    iteration in a 50-node swarm after a leader change).  Its own BEGIN, and any it sends as the acting leader,
    carry the term it led."""
    from types import SimpleNamespace

    from gwtf_node.runtime.node.aggregation import Aggregation

    ag = Aggregation.__new__(Aggregation)
    ag.leadership = SimpleNamespace(led_term=0, is_leader=lambda: False)
    copy = m.BeginAggregation(4, 6, term=3)  # the leader's, as it came
    assert ag._stamped(copy).term == 3
    ag.leadership = SimpleNamespace(led_term=2, is_leader=lambda: False)  # a former leader
    assert ag._stamped(m.BeginAggregation(4, 6)).term == 2  # its own BEGIN (the machine's, unstamped)
    assert ag._stamped(copy).term == 3
    ag.leadership = SimpleNamespace(led_term=5, is_leader=lambda: True)  # the acting leader hands on an old BEGIN
    assert ag._stamped(copy).term == 5 and ag._stamped(m.BeginAggregation(4, 6)).term == 5
