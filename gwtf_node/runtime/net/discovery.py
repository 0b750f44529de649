"""Discovery: how a node finds the peers of its run (Hello, PeerList, the DHT).

The node connects to its bootstrap peers and greets every peer it meets with
`Hello` (run id, role, stage, name, capacity, addresses, and its standing:
joining / ready from / leaving after).  A peer answers a first Hello with its
own, and with `PeerList` (the addresses of the peers the sender works with,
protocol/fanout.py) whenever the sender is new or changed role or stage, so
a swarm of any shape finds itself from one bootstrap address.  A peer of another run, or with a role or stage that does
not exist, is refused, and told why with `Refused` (bootstrap.py: a node
refused before any peer accepted it stops with that reason).  A peer that
comes back (gone, or restarted: a new incarnation in its Hello, see
peers.py) is handed to `on_peer_back` first, which checks it and forgets its
old incarnation.

The DHT is the second way in (`loop`).  Records (versioned, the highest
version wins everywhere; see host.py; each signed by its writer and checked
on read, records.py): `run/<run id>` holds the manifest (put by data nodes),
`node/<peer id>` holds {name, role, stage, addrs, expires} (put by every node,
again when its stage or addresses change and every `RECORD_REFRESH_S`; a
provider whose record expired, `RECORD_TTL_S` after it was written, is not
dialled), `run/<run id>/revoked` the owner's revocation list
(read from this host's own DHT copy every round and over the network every `REVOCATIONS_EVERY_S`, and passed
on between peers, trust/spread.py; authorize.py drops the peers it names); provider records on
`run/<run id>` (everyone), `run/<run id>/data` (data nodes) and
`run/<run id>/stage/<k>` (relays) are how a node finds the peers it works
with (`fanout.provider_keys`: a relay looks at the data nodes' key and its
neighbouring stages' keys, and dials a provider only if its own signed node
record, read at the addresses it gives, says a role and stage it works with:
records.py `RunRecords.providers`).  The DHT is discovery only: who is alive
is decided by our own messages (`liveness.py`).

Bounded fan-out (protocol/fanout.py): a relay knows and dials only the data
nodes and the relays of its own and the neighbouring stages; a peer tells it
only of those (`_knows_of`); a relay of a stage it does not work with that
says Hello is let go of (`release`: out of the table, not gone, so nothing
presumes it dead or redials it; the connection closed) and referred to its
neighbours (`_refer`), and a candidate lets go of the relays of its sample
that it does not work with once it is placed (`prune`).

Addresses (addresses.py): a Hello carries the addresses the receiving peer
can use (no loopback to a remote peer, never 0.0.0.0); a PeerList carries
every usable address of every peer the receiver works with, and it dials each new
peer with all of them (again, backing off, while the greeting fails: `dial`); a
peer whose addresses change (relay.py) is passed on to the others at once.

With a links file (`--links`), the link to a named peer is shaped (latency,
bandwidth) as soon as its Hello names it.

A peer presumed dead is redialled (`redial_loop`: after 2 s, then backing off
to once a minute, for an hour) at the addresses it last said Hello from: a
peer cut off by a partition, or whose frames stalled longer than the
liveness check waits, is greeted again once it can be reached, and comes
back through the same Hello (BACK) as a restarted one.  Nothing else would
bring it back: liveness pings only the peers it watches, and the frames of a
gone peer are ignored.  A peer that left (Goodbye) is not redialled.  The
redial's Hello says `forgot_you`: a peer that had not presumed this node dead
(one side of a stall noticed it, the other not) forgets it too and takes it
back (Arrival.FORGOT_US, handled as a restart), so that both ends of every
flow link and microbatch start over alike.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable

import trio

from ...protocol import fanout
from ...protocol import messages as m
from ...protocol.bounds import MAX_ITEMS
from .addresses import usable_by
from .host import PeerUnreachable
from .hostdht import PERIOD_SPREAD, spread
from .peers import Arrival, PeerInfo, Peers
from .wire import FrameRefused, Wire, now

log = logging.getLogger("gwtf.node")

RECORD_TTL_S = 3600.0  # a node record says it expires this long after it was written (unix time: clocks may differ)
RECORD_REFRESH_S = 600.0  # ... and is written again this often (a node gone for an hour drops out of lookups)
REDIAL_FIRST_S = 2.0  # a peer presumed dead is dialled again this long after, then at twice the interval each time
REDIAL_MAX_S = 60.0  # ... up to once a minute
REDIAL_FOR_S = 3600.0  # ... for an hour (a volunteer's machine may reboot; one gone for good costs a dial a minute)
DHT_ROUND_S = 2.0  # the discovery loop's period; its first provider lookups come this often (`loop`)
DHT_ROUND_MAX_S = 256.0  # ... then, while they find no one new, at twice the interval each time, up to this
# the owner's revocation list is looked up over the network this often: a newer list also comes from the peers,
# each node passing on what it adopts (trust/spread.py), so this walk only covers a node cut off meanwhile
REVOCATIONS_EVERY_S = 600.0
# (and in this host's own copy of the DHT every round: `loop`)
DHT_WAIT_S = 10.0
PEER_LIST_DIALS = 256  # peers dialled for one PeerList (each once, with all its addresses)
RELEASE_AFTER_S = 2.0  # a peer let go of is disconnected this long after (the Hello telling it our new stage first)
HELLO_RETRY_S = (1.0, 2.0, 4.0, 8.0, 16.0)  # an answering Hello that could not be sent is sent again after these
DIAL_RETRY_S = (2.0, 4.0, 8.0, 16.0, 32.0)  # a greeting of a peer named to us that failed is tried again after these
ADDRS_PER_PEER = 16  # addresses of one peer passed on and dialled (IPv4, IPv6, relays: a handful in practice)
REFER_EVERY_S = 10.0  # a relay we do not work with that says Hello gets a PeerList of its neighbours this often
REFER_KEPT = 1024  # referrals remembered before the old ones are forgotten (and Hellos asked for: `ask_hello`)


def _due(book: dict[str, float], peer: str, t: float) -> bool:
    """`peer` was not answered within `REFER_EVERY_S` of `t` in `book` (peer -> when): note `t` and say so; a book
    of `REFER_KEPT` forgets the entries old enough to be made again."""
    if t - book.get(peer, -REFER_EVERY_S) < REFER_EVERY_S:
        return False
    if len(book) >= REFER_KEPT:
        for p in [p for p, at in book.items() if t - at >= REFER_EVERY_S]:
            del book[p]
    book[peer] = t
    return True


class Discovery:
    def __init__(self, wire: Wire, peers: Peers, host: Any, manifest: Any,
                 links_cfg: dict[tuple[str, str], tuple[float, float]],
                 on_peer_hello: Callable[[PeerInfo], None], applied_steps: Callable[[], int] = lambda: 0,
                 incarnation: int = 0,
                 on_peer_back: Callable[[PeerInfo, Arrival], bool] = lambda info, arrival: True,
                 certificate: bytes = b"", authorizer: Any = None, records: Any = None,
                 spread_by: float = PERIOD_SPREAD) -> None:
        self.wire = wire
        self.peers = peers
        self.host = host
        self.manifest = manifest
        self.run_id = manifest.run_id
        self.links_cfg = links_cfg
        self.on_peer_hello = on_peer_hello
        self.applied_steps = applied_steps  # optimizer steps applied to this node's part (its Hello says it)
        self.incarnation = incarnation  # drawn at each start of the process (its Hello says it)
        # a gone or restarted peer says Hello: checked (False: not taken back; or refused), its old one forgotten
        self.on_peer_back = on_peer_back
        self.hellos_sent: set[str] = set()
        self.certificate = certificate  # the owner's admission of this node, shown in every Hello
        self.authorizer = authorizer  # takes the owner's revocation lists (authorize.py)
        self.records = records  # signed DHT records (records.py); None: a test without a DHT
        self.spread_by = spread_by  # the loop's waits drawn within this share of their value (`loop`)
        self._rng = random.Random()
        self._revocations_copy: bytes | None = None  # this host's DHT copy of the list at the last local read
        host.on_addrs_changed = self.hello_all  # a relay reservation gave us an address: tell everyone
        self._redialling: set[str] = set()  # peers being redialled (`redial_loop`: one redial per peer at a time)
        self._referred: dict[str, float] = {}  # relays we do not work with -> when we last referred them (`_refer`)
        self._asked: dict[str, float] = {}  # unknown senders -> when we last asked them for a Hello (`ask_hello`)
        self._retrying: set[str] = set()  # peers whose greeting failed and waits to be tried again (`dial`)

    def hello(self, to: str, *, forgot_you: bool = False) -> m.Hello:
        """Our Hello to `to`, with the addresses it can use (host.addrs_for: no loopback to a remote peer)."""
        p = self.peers.place
        return m.Hello(self.run_id, p.role, -2 if p.stage is None else p.stage, self.peers.name, p.capacity,
                       tuple(self.host.addrs_for(to)), self.host.tensor_addr, p.joining, p.ready_from, p.leaving,
                       p.leave_after, self.applied_steps(), self.incarnation, self.certificate, forgot_you)

    def hello_all(self) -> None:
        """Tell every peer this node's place again (its stage or standing changed)."""
        for pid in self.peers.ids_known():
            self.wire.post(pid, self.hello(pid))

    async def greet(self, addr: str, *more: str, forgot_you: bool = False) -> str:
        """Connect to `addr` (or `more` addresses of the same peer) and say Hello (not to ourselves); its peer id,
        or `PeerUnreachable`.  `forgot_you`: this node presumed that peer dead (a redial)."""
        pid = await self.host.connect(addr, *more)
        if forgot_you and not self.peers.is_gone(pid):
            return pid  # (a redial that took long: the peer is back already, and must not forget us again)
        if pid != self.wire.me:
            self.hellos_sent.add(pid)  # before sending: its answer (Hello or Refused) may come at once
            if not await self.wire.send(pid, self.hello(pid, forgot_you=forgot_you)):
                raise PeerUnreachable(f"connected to {addr}, but the Hello could not be sent")
        return pid

    async def dial(self, addr: str, *more: str) -> None:
        """Greet the peer of a PeerList or a provider record; a greeting that fails is tried again after each of
        `DIAL_RETRY_S` while the peer is still unknown here (one retrying task per peer).  A connection that
        broke under the Hello (a peer's old connection to a restarted node with the same id) is no reason to
        wait for the DHT's next lookup, which may not name the peer again: a relay back with its state directory
        waited 150 s for a stage peer it had dialled once, that dial having failed."""
        pid = addr.rsplit("/p2p/", 1)[-1] if "/p2p/" in addr else ""
        for delay in (0.0, *DIAL_RETRY_S):
            if delay:
                if not pid or pid in self._retrying:
                    return
                self._retrying.add(pid)
                try:
                    await trio.sleep(delay)
                finally:
                    self._retrying.discard(pid)
                if pid in self.peers or self.peers.is_gone(pid):
                    return  # (met meanwhile; a peer presumed dead is `redial_loop`'s)
            try:
                await self.greet(addr, *more)
                return
            except Exception as e:  # noqa: BLE001 - any dial failure is logged and tried again
                (log.debug if delay else log.warning)("could not reach %s: %s", addr, e)

    async def loop(self) -> None:
        """Publish our DHT records and look for peers of the run there.

        Every `DHT_ROUND_S` the loop looks whether this node's place or addresses changed (published again at
        once); it asks the DHT for providers at the first rounds, and again after a wait that doubles with each
        round that found no one new to dial, up to `DHT_ROUND_MAX_S` (back to `DHT_ROUND_S` when its place
        changes or a round found someone).  A formed swarm is found by Hello and PeerList, and a newcomer finds its
        peers through its own lookups, so the lookups of the members can slow down: each one is a walk over up to
        twenty peers, and a swarm whose members all looked every two seconds spent most of its event loops' time
        answering them (with a ceiling of 32 s, the walks were still a quarter of a relay's loop CPU in a
        26-daemon swarm).  The owner's revocation list is read every round from this host's own copy of the
        DHT (no walk: `revoke --publish-to` stores it at the twenty peers closest to its key, which in a swarm
        of up to twenty is everyone, and a walk that finds it refreshes the copy), and looked up over the
        network every `REVOCATIONS_EVERY_S`.  A publish that fails or times out is tried again after
        `DHT_ROUND_S`, then at twice the interval each time up to `DHT_ROUND_MAX_S`, and a change of place starts
        one provider lookup, not one a round until it is published: on a loaded machine puts time out, and every
        retry is a walk of the DHT.  A retry starts at the step that failed (`_publish`: manifest, node record,
        provider records; 7-8 puts and 5-6 provides per node in the first four minutes of a 50-daemon swarm when
        each retry did every step again).  Each of these waits (the refresh, the lookups', the network read's) is
        drawn within `spread_by` of its value (hostdht.py `spread`): daemons started together do not walk the
        DHT together every period."""
        run_key = f"run/{self.run_id}"
        published: tuple | None = None
        looked_for: tuple | None = None
        refresh_at = providers_at = revocations_at = publish_at = 0.0
        stored: set[str] = set()  # the steps of the publish of `stored_for` done already: a retry skips them
        stored_for: tuple | None = None
        wait = publish_wait = DHT_ROUND_S
        while True:
            if self.peers.ids_known():
                role, stage = self.peers.role, self.peers.stage
                mine = (role, stage, tuple(self.host.addrs))
                if (published != mine or now() >= refresh_at) and now() >= publish_at:
                    if stored_for != mine:
                        stored_for, stored = mine, set()
                    if await self._publish(run_key, role, stage, stored):
                        published, publish_wait = mine, DHT_ROUND_S
                        refresh_at = now() + spread(RECORD_REFRESH_S, self._rng, self.spread_by)
                        stored = set()  # (the refresh stores everything again)
                    else:  # failed or timed out: again after a wait that doubles (module doc)
                        publish_at, publish_wait = now() + publish_wait, min(DHT_ROUND_MAX_S, 2 * publish_wait)
                if looked_for != mine or now() >= providers_at:
                    dialled = 0
                    try:
                        with trio.move_on_after(DHT_WAIT_S):
                            dialled = await self._dial_providers()
                    except Exception as e:  # noqa: BLE001
                        log.debug("find_providers failed: %s", e)
                    wait = DHT_ROUND_S if looked_for != mine or dialled else min(DHT_ROUND_MAX_S, 2 * wait)
                    looked_for, providers_at = mine, now() + spread(wait, self._rng, self.spread_by)
                if now() >= revocations_at:
                    await self._read_revocations(f"{run_key}/revoked")
                    revocations_at = now() + spread(REVOCATIONS_EVERY_S, self._rng, self.spread_by)
                else:
                    await self._read_revocations(f"{run_key}/revoked", local_only=True)
            await trio.sleep(DHT_ROUND_S)

    async def _publish(self, run_key: str, role: str, stage: int | None, stored: set[str]) -> bool:
        """Store the run's manifest (a data node), this node's record and its provider records, each step within
        `DHT_WAIT_S`; the steps done are noted in `stored` and skipped when a publish that stopped at a later
        one is tried again (each step is a walk of the DHT; on a loaded machine puts time out).  Whether every
        step is done."""
        rec = {"name": self.peers.name, "role": role, "stage": stage, "addrs": self.host.addrs,
               "run_id": self.run_id, "expires": round(time.time() + RECORD_TTL_S)}
        steps = [("run", lambda: self.records.put(run_key, self.manifest.to_json()))] if role == "data" else []
        steps.append(("node", lambda: self.records.put(f"node/{self.wire.me}", rec)))
        steps += [(key, lambda key=key: self.host.provide(key))
                  for key in fanout.provided_keys(self.run_id, role, stage)]
        for name, step in steps:
            if name in stored:
                continue
            try:
                with trio.fail_after(DHT_WAIT_S):
                    await step()
            except Exception as e:  # noqa: BLE001 - the DHT is best effort; tried again (`loop`)
                log.debug("DHT publish stopped at %s: %r", name, e)
                return False
            stored.add(name)
        return True

    def works_with(self, role: str, stage: int | None) -> bool:
        """Whether this node dials a peer of that role and stage (protocol/fanout.py: its own and the
        neighbouring stages, the data nodes; while not placed, a sample of each stage)."""
        mine = self.peers.place
        if fanout.works_with(mine.role, mine.stage, role, stage):
            return True
        known = len(self.peers.ids("relay", stage)) if stage is not None and stage >= 0 else 0
        return fanout.wants_sample(mine.role, mine.stage, role, stage, known)

    async def _dial_providers(self) -> int:
        """Dial the peers this node works with that the DHT names and it does not know: the providers of the keys
        its place looks at, each at the addresses of its own signed node record, kept if that record's role and
        stage are ones this node works with (a provider record outlives a node's move to another stage).  The
        number of peers dialled."""
        dialled = 0
        me = self.wire.me

        def unknown(pid: str) -> bool:
            return pid != me and pid not in self.peers and not self.peers.is_gone(pid)

        p = self.peers.place
        for key in fanout.provider_keys(self.run_id, p.role, p.stage, self.peers.n_stages):
            for pid, addrs, role, stage in await self.records.providers(key, unknown):  # checked (records.py)
                addrs = [a if "/p2p/" in a else f"{a}/p2p/{pid}" for a in addrs if usable_by(a, True)]
                if addrs and unknown(pid) and self.works_with(role, stage):
                    self.wire.spawn(self.dial, *addrs)
                    dialled += 1
        return dialled

    def _knows_of(self, to: PeerInfo | None, info: PeerInfo) -> bool:
        """Whether peer `to` is told of `info` (a PeerList): when `to` works with it (`works_with` from `to`'s
        place; an unplaced relay: the data nodes and `fanout.SAMPLE_PER_STAGE` members of each stage, the
        lowest ids)."""
        if to is None or fanout.works_with(to.role, to.stage, info.role, info.stage):
            return True
        lower = sum(p < info.peer_id for p in self.peers.ids("relay", info.stage)) if info.stage >= 0 else 0
        return fanout.wants_sample(to.role, to.stage, info.role, info.stage, lower)

    def _far(self, role: str, stage: int) -> bool:
        """A relay placed in a stage that this relay, placed, does not work with (two or more stages away)."""
        mine = self.peers.place
        return role == "relay" and stage >= 0 and mine.role == "relay" and mine.stage is not None \
            and mine.stage >= 0 and not fanout.works_with(mine.role, mine.stage, role, stage)

    def prune(self) -> None:
        """This node was placed: let go of the relays it met while it had no stage (its sample) and does not work
        with from its stage (`release`)."""
        for info in self.peers.infos():
            if self._far(info.role, info.stage):
                self.release(info.peer_id)

    def release(self, peer: str, stage: int | None = None) -> None:
        """Out of the table (not gone: nothing presumes it dead or redials it), and the connection closed once the
        Hellos queued for it are out: neither end works with the other (`stage`: the one it now says)."""
        if stage is None:
            stage = getattr(self.peers.get(peer), "stage", None)
        log.info("letting go of %s (stage %s): not next to this node's stage %s", self.peers.who(peer), stage,
                 self.peers.stage)
        self.peers.drop(peer)
        self.hellos_sent.discard(peer)
        self.wire.spawn(self._disconnect_later, peer)

    async def _disconnect_later(self, peer: str) -> None:
        await trio.sleep(RELEASE_AFTER_S)
        if peer not in self.peers:
            await self.wire.disconnect(peer)

    async def redial_loop(self, presumed_dead: Callable[[], set[str]], addrs_of: Callable[[str], list[str]]) -> None:
        """Greet the peers presumed dead again, with backoff (module doc)."""
        plan: dict[str, tuple[float, float, float]] = {}  # peer -> (next dial, interval, presumed dead since)
        while True:
            await trio.sleep(1.0)
            t = now()
            dead = presumed_dead()
            for pid in [p for p in plan if p not in dead]:
                del plan[pid]
            for pid in sorted(dead):
                due, every, since = plan.setdefault(pid, (t + REDIAL_FIRST_S, REDIAL_FIRST_S, t))
                if t < due or t - since > REDIAL_FOR_S or pid in self._redialling:
                    continue
                plan[pid] = (t + every, min(2 * every, REDIAL_MAX_S), since)
                addrs = [a if "/p2p/" in a else f"{a}/p2p/{pid}" for a in addrs_of(pid)][:ADDRS_PER_PEER]
                if addrs:
                    self.wire.spawn(self._redial, pid, addrs, every == REDIAL_FIRST_S)

    async def _redial(self, peer: str, addrs: list[str], first: bool) -> None:
        (log.info if first else log.debug)("redialling %s, presumed dead", self.peers.who(peer))
        self._redialling.add(peer)
        try:
            await self.greet(*addrs, forgot_you=True)
        except Exception as e:  # noqa: BLE001 - unreachable for now: dialled again later
            log.debug("redial of %s failed: %s", self.peers.who(peer), e)
        finally:
            self._redialling.discard(peer)

    async def _read_revocations(self, key: str, local_only: bool = False) -> None:
        """The owner's revocation list from the DHT (anyone may store it: the owner's signature is checked);
        `local_only`: from this host's own copy."""
        if self.authorizer is None or self.authorizer.insecure:
            return
        from ...model.certificates import AdmissionError

        if local_only:  # (the same copy as at the last read: nothing to check again)
            raw = getattr(self.host, "dht_local", lambda k: None)(key)
            if raw is None or raw == self._revocations_copy:
                return
            self._revocations_copy = raw
        try:
            with trio.move_on_after(DHT_WAIT_S):
                rec = await self.records.get(key, local_only=local_only)
                if rec is not None and isinstance(rec.value, str):
                    self.authorizer.take_revocations(rec.value.encode(), f"the DHT (written by {rec.writer[:16]})")
        except AdmissionError:
            self.wire.count_refusal(m.RefusalCode.BAD_RECORD)
        except Exception as e:  # noqa: BLE001 - the DHT is best effort; read again next round
            log.debug("reading the revocation list failed: %s", e)

    def on_hello(self, sender: str, msg: m.Hello) -> None:
        if msg.run_id != self.run_id:
            self._refuse(sender, m.RefusalCode.OTHER_RUN,
                         f"Hello for run {msg.run_id!r}, this node trains run {self.run_id!r}",
                         "your run.json differs from the swarm's: use the run.json of the run you join")
        if msg.role not in ("data", "relay"):
            self._refuse(sender, m.RefusalCode.NO_SUCH_ROLE, f"Hello with role {msg.role!r} stage {msg.stage}",
                         "a node is a data node or a relay")
        if msg.role == "relay" and not -2 <= msg.stage < self.peers.n_stages:
            self._refuse(sender, m.RefusalCode.NO_SUCH_STAGE, f"Hello with role {msg.role!r} stage {msg.stage}",
                         f"run {self.run_id!r} has stages 0..{self.peers.n_stages - 1}")
        addrs = tuple(self.host.usable_addrs(sender, msg.addrs))  # (0.0.0.0 made the address it came from)
        info = PeerInfo(sender, msg.role, msg.stage, msg.name, msg.capacity, addrs, None,
                        msg.joining, msg.ready_from, msg.leaving, msg.leave_after, msg.steps, msg.incarnation)
        if self._far(msg.role, msg.stage):
            if sender in self.peers:  # (a joiner of this node's sample, placed elsewhere; or a stale address book)
                self.release(sender, msg.stage)
            self._refer(sender, info)
            return
        arrival = self.peers.arrival(sender, msg.incarnation)
        if arrival is Arrival.SAME and msg.forgot_you:
            arrival = Arrival.FORGOT_US
        if arrival in (Arrival.BACK, Arrival.RESTARTED, Arrival.FORGOT_US):
            if not self.on_peer_back(info, arrival):
                return
            self.host.note_addrs(sender, msg.addrs)  # (it may listen elsewhere now: redials go there)
        _old, changed = self.peers.upsert(info, now())
        relaying = getattr(self.host, "relaying", None)
        if _old is None and relaying is not None:
            relaying.greeted(sender, list(self.host.addrs))  # (a dial-back, if this node does not know yet)
        if _old is not None and not changed and set(_old.addrs) != set(addrs):
            self._pass_on_addrs(sender, addrs)
        self.on_peer_hello(info)
        reply: list[m.Message] = []
        # a peer forgotten and back, or back joining again before it was found dead: a restart that knows nobody
        restarted = _old is None or changed or (msg.joining and not _old.joining)
        if sender not in self.hellos_sent or restarted:
            self.hellos_sent.add(sender)
            reply.append(self.hello(sender))
        if changed:
            shaped = self.links_cfg.get((self.peers.name, msg.name))
            if shaped is not None:
                self.host.links.set_link(sender, *shaped)  # emulate the link: our sends to this peer
            log.info("peer %s: %s (%s)", msg.name or sender[:12], describe_place(msg.role, msg.stage), sender)
            reply.append(m.PeerList((tuple(self.host.addrs_for(sender)) + self._known_to(info))[:MAX_ITEMS]))
        if reply:
            self.wire.spawn(self._answer, sender, reply)

    def _known_to(self, info: PeerInfo) -> tuple[str, ...]:
        """The usable addresses of the peers we know that the peer of `info` is told of (`_knows_of`)."""
        local = self.host.peer_is_local(info.peer_id)
        return tuple(a for p in self.peers.infos() if p.peer_id != info.peer_id and self._knows_of(info, p)
                     for a in p.addrs[:ADDRS_PER_PEER] if usable_by(a, local))

    def ask_hello(self, sender: str) -> None:
        """A peer that never said Hello to this node sent it a frame (refused): its Hello was lost, while ours
        reached it (a connection that broke under its answer on a loaded machine: seen with 100 daemons on 2
        cores, a stage's all-reduce stalled 3 minutes on the frames refused), so it works with this node, which
        refuses it.  Our Hello saying that we do not know it (`forgot_you`) makes it start over and say Hello back
        (`on_hello`'s FORGOT_US); at most once per `REFER_EVERY_S` per peer."""
        if not _due(self._asked, sender, now()):
            return
        log.info("frames from %s, which has not said Hello: asking it for one", sender[:16])
        self.wire.spawn(self._ask_hello, sender)

    def ask_restarted(self, peer: str) -> None:
        """`peer` answered a Ping from another incarnation than its Hello's (liveness.py `other_incarnation`): it
        restarted, and its new Hello did not reach this node, so its old process looks alive.  Our Hello, saying
        that we do not know it, gets the new one's Hello back, which `on_hello` takes in as a restart; at most once
        per `REFER_EVERY_S` per peer."""
        info = self.peers.get(peer)
        if info is None or not _due(self._asked, peer, now()):
            return
        log.info("%s answers from a new incarnation that has not said Hello: asking it for one", peer[:16])
        self.wire.spawn(self._ask_hello, peer, info.incarnation)

    async def _ask_hello(self, sender: str, old: int = 0) -> None:
        """Our Hello saying `forgot_you`, sent again after each of `HELLO_RETRY_S` while it could not be sent and
        the peer has not said Hello meanwhile (a lost request leaves the two refusing each other); `old`: the
        incarnation of the Hello this node holds, which the peer's next Hello replaces (0: it holds none)."""
        for delay in (0.0, *HELLO_RETRY_S):
            await trio.sleep(delay)
            info = self.peers.get(sender)
            said = info is not None and (not old or info.incarnation != old)
            if said or await self.wire.send(sender, self.hello(sender, forgot_you=True)):
                return

    def _refer(self, sender: str, info: PeerInfo) -> None:
        """A relay this node does not work with said Hello (it bootstraps through us, or its address book is
        stale): no Hello back, but the addresses of the peers we know that it works with (the data nodes, the
        relays next to its stage), so that it meets them and they answer; at most once per `REFER_EVERY_S`."""
        if not _due(self._referred, sender, now()):
            return
        if known := self._known_to(info):
            log.debug("%s (stage %d) is not next to this node's stage: referred to %d addresses",
                      info.name or sender[:12], info.stage, len(known))
            self.wire.spawn(self._answer, sender, [m.PeerList(known[:MAX_ITEMS])])

    async def _answer(self, sender: str, reply: list[m.Message]) -> None:
        """Send the answer to a Hello, in order.  Our Hello in it that could not be sent (the connection broke
        under it: on a loaded machine a stream cannot always be opened) is sent again after each of
        `HELLO_RETRY_S` while the peer is known and not gone; one never sent is forgotten (`hellos_sent`), so the
        peer's next Hello is answered.  Without it the peer, which never heard our Hello, refuses every frame of
        ours as from an unknown peer, while we wait for its phase signals: an aggregation that never ends."""
        for msg in reply:
            if await self.wire.send(sender, msg) or not isinstance(msg, m.Hello):
                continue
            for delay in HELLO_RETRY_S:
                await trio.sleep(delay)
                if sender not in self.peers or self.peers.is_gone(sender):
                    return
                if await self.wire.send(sender, self.hello(sender)):
                    break
            else:
                self.hellos_sent.discard(sender)
                return

    def _pass_on_addrs(self, sender: str, addrs: tuple[str, ...]) -> None:
        """`sender` can be reached at new addresses (through a relay it reserved on): tell the other peers, who
        may not have reached it before (a PeerList of one)."""
        about = self.peers.get(sender)
        for pid in self.peers.ids_known():
            if pid != sender and (about is None or self._knows_of(self.peers.get(pid), about)):
                local = self.host.peer_is_local(pid)
                usable = tuple(a for a in addrs if usable_by(a, local))
                if usable:
                    self.wire.post(pid, m.PeerList(usable))

    def _refuse(self, sender: str, code: m.RefusalCode, why: str, fix: str) -> None:
        """Tell the sender why its Hello is refused (it stops if no peer accepted it), then refuse the frame."""
        self.wire.post(sender, m.Refused(code, f"{why}: {fix}"))
        raise FrameRefused(why, code)

    def peer_forgotten(self, peer: str) -> None:
        """`peer` crashed or left: if it comes back, its Hello is answered with ours again."""
        self.hellos_sent.discard(peer)

    def on_peer_list(self, sender: str, msg: m.PeerList) -> None:
        """Dial the peers of the list we do not know yet, each once, with all the addresses the list gives it."""
        by_peer: dict[str, list[str]] = {}
        for addr in msg.addrs:  # (at most bounds.MAX_ITEMS: checked on arrival)
            pid = addr.rsplit("/p2p/", 1)[-1]
            if pid and pid != self.wire.me and pid not in self.peers:
                by_peer.setdefault(pid, []).append(addr)
        for addrs in list(by_peer.values())[:PEER_LIST_DIALS]:
            self.wire.spawn(self.dial, *addrs[:ADDRS_PER_PEER])


def describe_place(role: str, stage: int) -> str:
    """A peer's role and stage in words for the logs ("relay of stage 2", "data node", "relay without a stage")."""
    if role == "data":
        return "data node"
    return f"{role} of stage {stage}" if stage >= 0 else f"{role} without a stage yet"
