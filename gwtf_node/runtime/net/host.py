"""The node's network host: py-libp2p (Noise + Yamux + Kademlia) plus the fast tensor channel.

What it offers the daemon (see `Host`): a peer id and addresses, `connect`, `send(peer, envelope, payload)` with
one incoming handler, and a small DHT API with versioned records.  How:

* Security and multiplexing are pinned: the only security transport offered is Noise (no plaintext, secio or TLS
  fallback) and the only muxer is Yamux (py-libp2p's Mplex is slower still).  The identity is the Ed25519 key of
  the state directory (`identity.py`), so a restarted node keeps its peer id.
* Control frames (no payload) go on one long-lived libp2p stream per peer and direction, protocol `/gwtf/ctrl/1.0.0`,
  framed by `frames.py`. Frames with a payload go over the tensor channel (`channel.py`), keyed through libp2p but
  moving bytes over a plain TCP socket with AES-256-GCM: several times faster than Yamux (numbers in
  docs/bench_transport.md). Order is FIFO per peer within each of the two kinds (control, payload); a control frame
  sent after a payload frame may overtake it. Each send is bounded by `send_timeout` (a payload frame: plus its bytes
  at 1 Mbit/s, each 1 MiB record within `send_timeout`: `frames.frame_deadline_s`) and fails with `PeerUnreachable`;
  a broken stream or channel is dropped and reopened once before giving up. `payload_moved` says when a payload
  record last came from and went to each peer (the all-reduce tells a slow link from a silent peer by it).
* Incoming: each libp2p stream and each channel connection is drained by its own task (Yamux resets a stream whose
  reader stalls for 5 s), which only parses frames and puts them on a per-peer queue (`INBOX_FRAMES` deep); one
  task per peer calls the handler, so a slow handler delays that peer's frames but never stalls a reader.  A frame
  that breaks the framing rules is logged on "gwtf.transport" and its stream reset (connection closed for the
  channel); the host carries on.
* Traps of py-libp2p 0.8.1 handled: every read after a frame starts has a deadline; `connect` lifts the 60 s
  negative dial cache before dialling (a restarted peer can be redialled at once) and re-adds the peer's
  addresses with a long TTL (libp2p keeps them 120 s only).
* Addresses (addresses.py): listen on several endpoints (`listen`), advertise the announced ones or the listen
  ones with 0.0.0.0/:: expanded; a peer's addresses are taken as usable from here (`note_addrs`), ours given as
  usable by it (`addrs_for`: loopback only to a peer on this machine).
* Behind NAT: a tensor channel that cannot be dialled within `DIRECT_DIAL_TIMEOUT_S` (the peer's router drops the
  SYN) is replaced, for `DIRECT_RETRY_S`, by one libp2p stream per peer (`/gwtf/payload/1.0.0`, the same frames as
  the control stream) over the connection that exists because the NATed peer dialled out. `connection_kind` and
  `payload_path` say which way a peer is reached.
* DHT (hostdht.py): versioned records, the highest version wins.
* Link shaping (`links.py`) applies to both kinds of frame: a shaped `send` returns when the frame has departed,
  the write happens after the latency.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.exceptions import BaseLibp2pError
from libp2p.host.exceptions import StreamFailure
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.network.exceptions import SwarmException
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import InvalidAddrError, PeerInfo, info_from_p2p_addr
from multiaddr import Multiaddr

from . import channel, conninfo, frames, holepunch
from .addresses import Endpoint, default_tensor_port, from_peer
from .addresses import is_loopback_host, listen_endpoints, parse_announce, usable_by
from .channel import ChannelError, ChannelUnreachable, RawConn, SessionKeys, TensorSender
from .dialback import DIALBACK_PROTOCOL_ID, serve as dialback_serve
from .frames import DEFAULT_FRAME_TIMEOUT_S, Buffered, DEFAULT_MAX_PAYLOAD_BYTES, FrameError, encode_header, read_frame
from .hostdht import DHT_NAMESPACE, DHT_QUERY_TIMEOUT_S, HostDht, SpreadDHT, VersionedValidator, pack_record, unpack_record
from .limits import MAX_CTRL_STREAMS_PER_PEER, MAX_PENDING_SESSIONS_PER_PEER, ConnectionBound
from .links import LinkShaper
from .relay import Relaying, is_circuit, looks_natted, routable
from .hostlisten import check_listening, new_libp2p_host, open_tensor_listeners, own_connections, probe_ports

log = logging.getLogger("gwtf.transport")

CTRL_PROTOCOL_ID = TProtocol("/gwtf/ctrl/1.0.0")
TENSOR_PROTOCOL_ID = TProtocol(channel.TENSOR_PROTOCOL_ID)
# payload frames over the libp2p connection itself, where the peer's tensor channel cannot be dialled (NAT)
PAYLOAD_PROTOCOL_ID = TProtocol("/gwtf/payload/1.0.0")
INBOX_FRAMES = 1024  # frames queued per peer before its readers wait for the handler
ADDR_TTL_S = 7 * 24 * 3600  # how long connect() keeps a peer's addresses (libp2p default: 120 s)
ADDRS_CACHE_S = 1.0  # libp2p's advertised addresses are read again after this (`addrs`)
DEFAULT_SEND_TIMEOUT_S = 30.0  # a send (dial, handshake, write) must finish within this
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0  # tensor-channel handshake, both halves
DIRECT_DIAL_TIMEOUT_S = 5.0  # a tensor-channel dial not connected by then is blocked (a home router drops the SYN,
# so only a timeout tells; a public peer answers within one round trip, well under a second across the world)
DIRECT_RETRY_S = 300.0  # after a blocked dial, payloads to that peer go over libp2p this long before a new try
LIBP2P_CHUNK_BYTES = 1 << 20  # payload bytes per Yamux write on the fallback path
PRIVATE_DIAL_TIMEOUT_S = 3.0  # a private address of a peer with a relayed one: a LAN answers within this

Handler = Callable[[str, bytes, "memoryview | bytes | bytearray"], Awaitable[None]]
ALIVE_S = 10.0  # a control frame from a peer this recently: its connection is alive (`_close_stale_connections`)
_PEER_ERRORS = (BaseLibp2pError, OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                ChannelError, trio.TooSlowError)


class PeerUnreachable(Exception):
    """A send to a peer failed (dial, handshake or write) within its deadline."""


async def _end(stream: INetStream, *, reset: bool = True) -> None:
    """Reset (or close) a stream within 1 s, whatever state it is in."""
    with trio.move_on_after(1):
        try:
            await (stream.reset() if reset else stream.close())
        except _PEER_ERRORS:
            pass


async def _libp2p_reader(stream: INetStream, n: int) -> bytes:
    try:
        return await stream.read(n)
    except StreamEOF:
        return b""


class Host(HostDht, conninfo.HostConnections):
    """A running node host; build it with `open_host`."""

    def __init__(self, libp2p_host: IHost, nursery: trio.Nursery, tensor_addr: str, *, links: LinkShaper,
                 max_payload: int, send_timeout: float, handshake_timeout: float, frame_timeout: float) -> None:
        self.libp2p = libp2p_host
        self._nursery = nursery
        self.peer_id: str = libp2p_host.get_id().to_base58()
        self.tensor_addr = tensor_addr
        self.links = links
        self.max_payload = max_payload
        self.send_timeout = send_timeout
        self.handshake_timeout = handshake_timeout
        self.frame_timeout = frame_timeout
        self.dht: KadDHT | None = None
        self._handler: Handler | None = None
        self._inbox: dict[str, trio.MemorySendChannel] = {}
        self._ctrl_out: dict[str, INetStream] = {}
        self._ctrl_locks: dict[str, trio.Lock] = {}
        self._tensor_out: dict[str, TensorSender] = {}
        self._tensor_locks: dict[str, trio.Lock] = {}
        self._payload_out: dict[str, INetStream] = {}  # the fallback: a libp2p stream per peer
        self._direct_blocked_until: dict[str, float] = {}  # peer -> trio time to try its tensor channel again
        self.relaying: Relaying | None = None  # circuit relay v2 (relay.py): a relay service, or a NATed node
        self.on_addrs_changed: Callable[[], None] = lambda: None  # our advertised addresses changed (a reservation)
        self._addrs_cache: tuple[float, list[str]] | None = None  # (when, libp2p's advertised addresses then)
        self._pending_sessions: dict[bytes, tuple[str, SessionKeys, float]] = {}
        self._ctrl_in: dict[str, int] = {}  # incoming control streams being read, per peer
        self._heard_on: dict[int, float] = {}  # id of a libp2p connection -> trio time a control frame last came on it
        self.stats = {"frames_in": 0, "frames_out": 0, "bytes_out": 0, "bytes_in": 0, "refused": 0}
        self.payload_moved: dict[tuple[str, bool], float] = {}  # (peer, came from it) -> trio time of a payload record

    def _moved(self, peer_id: str, came: bool = False) -> None:
        self.payload_moved[peer_id, came] = trio.current_time()

    # ---- identity and addresses ---------------------------------------------

    @property
    def addrs(self) -> list[str]:
        """The advertised addresses (announced, or listen addresses with 0.0.0.0/:: expanded; addresses.py); only
        the relayed ones once a dial-back said nobody reaches the others (relay.py)."""
        circuits = self.relaying.circuit_addrs if self.relaying else []
        if circuits and self.relaying.reachable is False:
            return list(circuits)
        t = trio.current_time()  # (libp2p parses every address at each read: 0.1 ms, once per peer in a Hello round)
        if not self._addrs_cache or not self._addrs_cache[1] or t - self._addrs_cache[0] >= ADDRS_CACHE_S:
            self._addrs_cache = (t, [str(a) for a in self.libp2p.get_addrs()])
        return self._addrs_cache[1] + circuits

    def addrs_for(self, peer_id: str) -> list[str]:
        """The advertised addresses `peer_id` can use: loopback ones only for a peer on this machine."""
        local = self.peer_is_local(peer_id)
        return [a for a in self.addrs if usable_by(a, local)]

    def connected_peers(self) -> list[str]:
        return [p.to_base58() for p in self.libp2p.get_connected_peers()]

    async def connect(self, multiaddr: str, *more: str) -> str:
        """Dial a peer by its multiaddrs (ending in /p2p/<id>; `more`: other addresses of the same peer), direct
        ones first, then circuit-relay ones (relay.py); returns its peer id."""
        info = info_from_p2p_addr(Multiaddr(multiaddr))
        pid, direct, circuits = info.peer_id, [], []
        for a in (multiaddr, *more):
            try:
                one = info_from_p2p_addr(Multiaddr(a))
            except (ValueError, InvalidAddrError):
                continue
            if one.peer_id == pid:
                circuits.append(a) if is_circuit(a) else direct.extend(x for x in one.addrs if x not in direct)
        swarm = self.libp2p.get_network()
        swarm.unblock_peer(pid)  # a restarted peer must not wait out the 60 s negative cache
        self.libp2p.get_peerstore().add_addrs(pid, direct, ADDR_TTL_S)
        # a peer with a relayed address and only private direct ones is behind another router, most likely:
        # do not sit through libp2p's retries of an unroutable address before taking the relay
        limit = PRIVATE_DIAL_TIMEOUT_S if circuits and self.relaying and looks_natted(list(map(str, direct))) \
            else self.send_timeout
        try:
            with trio.fail_after(limit):
                await self.libp2p.connect(PeerInfo(pid, direct))
        except _PEER_ERRORS as e:
            swarm.unblock_peer(pid)
            if not circuits or self.relaying is None:
                raise PeerUnreachable(f"cannot connect to {multiaddr}: {e}") from e
            await self._connect_relayed(pid, circuits, e)
        self.libp2p.get_peerstore().add_addrs(pid, direct, ADDR_TTL_S)
        if self.relaying is not None and direct:
            self.relaying.met(pid.to_base58(), multiaddr, self.addrs, self.connection_kind(pid.to_base58()) == "direct")
        if self.dht is not None:
            await self.dht.add_peer(pid, skip_server_mode_check=True)
        return pid.to_base58()

    async def _connect_relayed(self, pid: ID, circuits: list[str], direct_error: BaseException) -> None:
        last: BaseException = direct_error
        for c in circuits:
            try:
                await self.relaying.dial(c)
                log.info("reached %s through a relay (%s); direct: %s", pid, c, direct_error)
                return
            except Exception as e:  # noqa: BLE001 - the circuit transport raises several types; next circuit
                last = e
        raise PeerUnreachable(f"cannot connect to {pid} directly ({direct_error}) or through a relay: {last}")

    def usable_addrs(self, peer_id: str, multiaddrs) -> list[str]:
        """`peer_id`'s addresses as it told them, made usable from here (addresses.from_peer)."""
        return from_peer(multiaddrs, self.remote_host(peer_id))

    def note_addrs(self, peer_id: str, multiaddrs) -> int:
        """`peer_id`'s own listen addresses (its Hello; each ending in /p2p/<its id>): kept for dialling it again
        (a restarted peer listens on another port).  Addresses naming another peer, and addresses it cannot be
        reached at from here (addresses.from_peer), are skipped; returns how many were kept."""
        kept = 0
        for a in self.usable_addrs(peer_id, multiaddrs):
            try:
                info = info_from_p2p_addr(Multiaddr(a))
            except (ValueError, InvalidAddrError):
                continue
            if info.peer_id.to_base58() == peer_id:
                self.libp2p.get_peerstore().add_addrs(info.peer_id, info.addrs, ADDR_TTL_S)
                kept += 1
        return kept

    # ---- sending --------------------------------------------------------------

    async def send(
        self, peer_id: str, envelope: bytes, payload: bytes | bytearray | memoryview = b"",
        *, wait_delivered: bool = False,
    ) -> None:
        """Send one frame to `peer_id`; FIFO per peer and kind; `PeerUnreachable` on failure.

        With a shaped link the call returns once the frame has departed (the
        write follows after the link's latency) unless `wait_delivered`.
        """
        header = encode_header(len(envelope), len(payload), self.max_payload)
        view = memoryview(payload).cast("B") if len(payload) else memoryview(b"")
        if len(view):
            write = lambda: self._send_tensor(peer_id, header, envelope, view)  # noqa: E731
        else:
            write = lambda: self._send_ctrl(peer_id, header + envelope)  # noqa: E731
        delivery = await self.links.submit(peer_id, len(header) + len(envelope) + len(view), write,
                                           lane="tensor" if len(view) else "ctrl")
        if wait_delivered:
            await delivery.done.wait()
            if delivery.error is not None:
                raise delivery.error

    async def _send_ctrl(self, peer_id: str, data: bytes) -> None:
        async with self._ctrl_locks.setdefault(peer_id, trio.Lock()):
            await self._write_frame(peer_id, self._ctrl_out, CTRL_PROTOCOL_ID, lambda: (data,), len(data),
                                    "control frame")

    async def _send_tensor(self, peer_id: str, header: bytes, envelope: bytes, payload: memoryview) -> None:
        lock = self._tensor_locks.setdefault(peer_id, trio.Lock())
        async with lock:
            if self._direct_blocked_until.get(peer_id, -1.0) <= trio.current_time() and self._no_channel(peer_id):
                self._direct_blocked_until[peer_id] = trio.current_time() + DIRECT_RETRY_S
                log.info("%s is behind NAT (connected %s from %s): its payloads go over the libp2p connection",
                         peer_id, self.connection_kind(peer_id), self.remote_host(peer_id))
            if self._direct_blocked_until.get(peer_id, -1.0) > trio.current_time():
                await self._send_payload_libp2p(peer_id, header, envelope, payload)
                return
            last: BaseException | None = None
            for _attempt in range(2):
                sender = self._tensor_out.get(peer_id)
                try:
                    with trio.fail_after(self.send_timeout) as scope:
                        if sender is None:
                            sender = await self._open_channel(peer_id)
                            self._tensor_out[peer_id] = sender
                            sender.moved = lambda: self._moved(peer_id)
                        scope.deadline = trio.current_time() + frames.frame_deadline_s(self.send_timeout, len(payload))
                        await sender.send_frame(header, envelope, payload, stall_s=self.send_timeout)
                    self._direct_blocked_until.pop(peer_id, None)
                    self.stats["frames_out"] += 1
                    self.stats["bytes_out"] += len(payload)
                    return
                except ChannelUnreachable as e:  # behind NAT or a firewall: the libp2p connection carries it
                    log.info("tensor channel of %s cannot be dialled (%s): its payloads go over the libp2p "
                             "connection for %.0f s", peer_id, e, DIRECT_RETRY_S)
                    self._direct_blocked_until[peer_id] = trio.current_time() + DIRECT_RETRY_S
                    await self._send_payload_libp2p(peer_id, header, envelope, payload)
                    return
                except (*_PEER_ERRORS, FrameError) as e:
                    last = e
                    if sender is not None:
                        sender.close()  # a half-written frame poisons the channel: start a new one
                    self._tensor_out.pop(peer_id, None)
                except BaseException:  # cancelled by the caller (an all-reduce round given up), maybe mid-frame
                    if sender is not None:
                        sender.close()
                    self._tensor_out.pop(peer_id, None)
                    raise
            raise PeerUnreachable(f"payload frame to {peer_id} failed: {last!r}") from last

    async def _send_payload_libp2p(self, peer_id: str, header: bytes, envelope: bytes, payload: memoryview) -> None:
        """One payload frame on the `PAYLOAD_PROTOCOL_ID` stream to `peer_id` (the caller holds its tensor lock)."""
        def parts():
            yield header + envelope
            for off in range(0, len(payload), LIBP2P_CHUNK_BYTES):
                yield bytes(payload[off:off + LIBP2P_CHUNK_BYTES])

        await self._write_frame(peer_id, self._payload_out, PAYLOAD_PROTOCOL_ID, parts, len(payload),
                                "payload frame over libp2p")

    async def _write_frame(self, peer_id: str, streams: dict[str, INetStream], protocol: TProtocol,
                           parts: Callable[[], Iterable[bytes]], counted: int, what: str) -> None:
        """Write one frame (`parts()`) on `streams[peer_id]`, opened with `protocol` when missing; on failure once
        more on a new stream (a half-written frame poisons a stream); `PeerUnreachable` when both fail."""
        last: BaseException | None = None
        for _attempt in range(2):
            try:
                with trio.fail_after(frames.frame_deadline_s(self.send_timeout, counted)):
                    stream = streams.get(peer_id)
                    if stream is None:
                        stream = await self._new_stream(peer_id, protocol)
                        streams[peer_id] = stream
                    for part in parts():
                        await stream.write(part)
                        if protocol == PAYLOAD_PROTOCOL_ID:
                            self._moved(peer_id)
                self.stats["frames_out"] += 1
                self.stats["bytes_out"] += counted
                return
            except _PEER_ERRORS as e:
                last = e
                await self._drop_stream(streams, peer_id)
                if isinstance(e, (SwarmException, StreamFailure)) and _attempt == 0:  # (see the next method)
                    await self._close_stale_connections(peer_id)
            except BaseException:  # cancelled by the caller, maybe mid-frame: the next frame takes a new stream
                with trio.CancelScope(shield=True):
                    await self._drop_stream(streams, peer_id)
                raise
        raise PeerUnreachable(f"{what} to {peer_id} failed: {conninfo.causes(last)}") from last

    async def _close_stale_connections(self, peer_id: str) -> None:
        """Close the connections libp2p holds to `peer_id` that open no stream (closed but still listed: py-libp2p
        0.8.1 dials only when it lists none; or refusing streams, or leaving their negotiation unanswered 10 s), so
        that the next attempt dials anew, instead of failing until the peer presumes this node dead.  One a control
        frame came in on within `ALIVE_S` stays: it works, the peer is slow, and closing it fails every frame in
        flight on it both ways (416 closes in a 100-daemon swarm, 49 of them relays' connections to the data node)."""
        pid = ID.from_base58(peer_id)
        t, heard = trio.current_time(), self._heard_on
        self._heard_on = heard = {k: v for k, v in heard.items() if t - v < ALIVE_S}  # (the others are stale)
        conns = self.libp2p.get_network().get_connections(pid)
        stale = [c for c in conns if id(c.muxed_conn) not in heard]
        if stale:
            self.stats["stale_closed"] = self.stats.get("stale_closed", 0) + len(stale)
            log.info("connections to %s open no stream: %d closed, the next frame dials anew", peer_id, len(stale))
        with trio.move_on_after(5):
            try:
                if len(stale) < len(conns):  # a live one stays
                    for c in stale:
                        await c.close()
                    return
                await self.libp2p.disconnect(pid)  # (closes each and takes the peer off the swarm's table)
            except Exception:  # noqa: BLE001 - they are going anyway
                pass

    async def drop_streams(self, peer_id: str) -> None:
        """Close the tensor channel and the streams to `peer_id` (`Wire.disconnect` closes its connections)."""
        if (sender := self._tensor_out.pop(peer_id, None)) is not None:
            sender.close()
        for streams in (self._ctrl_out, self._payload_out):
            await self._drop_stream(streams, peer_id)

    async def rehome_streams(self, peer_id: str) -> None:
        """Retire the control and payload streams to `peer_id` (holepunch.py `retire`: closed once the peer has
        read them), each under its lock so FIFO holds: the next frame opens a stream on the connection libp2p
        prefers now (after a hole punch, the direct one)."""
        for streams, locks in ((self._ctrl_out, self._ctrl_locks), (self._payload_out, self._tensor_locks)):
            async with locks.setdefault(peer_id, trio.Lock()):
                if (stream := streams.pop(peer_id, None)) is not None:
                    await holepunch.retire(stream)

    async def _drop_stream(self, streams: dict[str, INetStream], peer_id: str) -> None:
        stream = streams.pop(peer_id, None)
        if stream is not None:
            await _end(stream)

    async def _new_stream(self, peer_id: str, protocol: TProtocol) -> INetStream:
        pid = ID.from_base58(peer_id)
        self.libp2p.get_network().unblock_peer(pid)
        return await self.libp2p.new_stream(pid, [protocol])

    async def _open_channel(self, peer_id: str) -> TensorSender:
        stream = await self._new_stream(peer_id, TENSOR_PROTOCOL_ID)
        try:
            keys, addr = await channel.initiate(
                lambda n: _libp2p_reader(stream, n), stream.write, self.peer_id, peer_id
            )
        finally:
            await _end(stream, reset=False)
        host, _, port = addr.rpartition(":")
        reached = self.remote_host(peer_id) or "127.0.0.1"  # (py-libp2p gives no remote address for IPv6)
        if host in ("0.0.0.0", "::", "[::]", "") or (is_loopback_host(host) and not is_loopback_host(reached)):
            host = reached  # the peer listens everywhere (or names its own loopback): use the address we reached
        return await TensorSender.open(f"{host}:{port}", keys, peer_id, self.handshake_timeout,
                                       connect_timeout=min(DIRECT_DIAL_TIMEOUT_S, self.handshake_timeout))

    # ---- receiving ------------------------------------------------------------

    def set_handler(self, handler: Handler) -> None:
        """`await handler(peer_id, envelope, payload)` for every incoming frame, in order per peer."""
        self._handler = handler

    async def _deliver(self, peer_id: str, envelope: bytes, payload: bytearray) -> None:
        self.stats["frames_in"] += 1
        self.stats["bytes_in"] += len(payload)
        inbox = self._inbox.get(peer_id)
        if inbox is None:
            inbox, receive = trio.open_memory_channel(INBOX_FRAMES)
            self._inbox[peer_id] = inbox
            self._nursery.start_soon(self._dispatch, peer_id, receive)
        try:
            inbox.send_nowait((envelope, payload))
        except trio.WouldBlock:
            log.warning("inbox of %s full (%d frames): the handler is behind, readers wait", peer_id, INBOX_FRAMES)
            await inbox.send((envelope, payload))

    async def _dispatch(self, peer_id: str, receive: trio.MemoryReceiveChannel) -> None:
        async for envelope, payload in receive:
            if self._handler is None:
                log.warning("frame from %s dropped: no handler set", peer_id)
                continue
            await self._handler(peer_id, envelope, payload)

    async def _on_ctrl_stream(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        if self._ctrl_in.get(peer, 0) >= MAX_CTRL_STREAMS_PER_PEER:
            self.stats["refused"] += 1
            log.warning("control stream from %s refused: it has %d open already; stream reset", peer,
                        MAX_CTRL_STREAMS_PER_PEER)
            await _end(stream)
            return
        self._ctrl_in[peer] = self._ctrl_in.get(peer, 0) + 1
        try:
            await self._read_ctrl_stream(peer, stream)
        finally:
            self._ctrl_in[peer] -= 1
            if not self._ctrl_in[peer]:
                del self._ctrl_in[peer]

    async def _read_ctrl_stream(self, peer: str, stream: INetStream) -> None:
        reader = Buffered(lambda n: _libp2p_reader(stream, n))  # (a frame in one read of the stream, or fewer)
        try:
            while True:
                frame = await read_frame(reader, max_payload=self.max_payload, frame_timeout=self.frame_timeout,
                                         moved=lambda: self._moved(peer, True))
                if frame is None:  # the peer closed its end: close ours (holepunch.retire waits for it)
                    return await _end(stream, reset=False)
                self._heard_on[id(stream.muxed_conn)] = trio.current_time()
                await self._deliver(peer, *frame)
        except FrameError as e:
            self.stats["refused"] += 1
            log.warning("control stream from %s refused: %s; stream reset", peer, e)
            await _end(stream)
        except _PEER_ERRORS as e:
            log.info("control stream from %s lost: %r", peer, e)

    async def _on_tensor_handshake(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        try:
            with trio.fail_after(self.handshake_timeout):
                keys = await channel.respond(
                    lambda n: _libp2p_reader(stream, n), stream.write, self.peer_id, peer, self.tensor_addr
                )
            now = trio.current_time()
            self._pending_sessions = {
                sid: v for sid, v in self._pending_sessions.items() if v[2] > now
            }
            theirs = [sid for sid, v in self._pending_sessions.items() if v[0] == peer]  # oldest first
            for sid in theirs[:max(0, len(theirs) - MAX_PENDING_SESSIONS_PER_PEER + 1)]:
                del self._pending_sessions[sid]
            self._pending_sessions[keys.session_id] = (peer, keys, now + self.handshake_timeout)
            await stream.close()
        except (FrameError, ChannelError, trio.TooSlowError) as e:
            self.stats["refused"] += 1
            log.warning("tensor handshake from %s refused: %s", peer, e)
            await _end(stream)
        except _PEER_ERRORS as e:
            log.info("tensor handshake from %s lost: %r", peer, e)

    def _claim_session(self, session_id: bytes) -> tuple[str, SessionKeys] | None:
        entry = self._pending_sessions.pop(session_id, None)
        if entry is None or entry[2] < trio.current_time():
            self.stats["refused"] += 1
            return None
        return entry[0], entry[1]

    async def _on_tensor_conn(self, stream: trio.SocketStream) -> None:
        await channel.serve_connection(
            RawConn(stream.socket),
            self._claim_session,
            self._deliver,
            max_payload=self.max_payload,
            handshake_timeout=self.handshake_timeout,
            frame_timeout=self.frame_timeout,
            moved=lambda peer: self._moved(peer, True),
        )

@asynccontextmanager
async def open_host(
    state_dir: Path,
    listen_host: str = "127.0.0.1",
    port: int = 0,
    *,
    listen: list[str] | tuple[str, ...] = (),
    announce: list[str] | tuple[str, ...] = (),
    links: LinkShaper | None = None,
    max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
    bootstrap: list[str] | tuple[str, ...] = (),
    dht: bool = True,
    tensor_port: int | None = 0,
    relay_service: bool = False,
    send_timeout: float = DEFAULT_SEND_TIMEOUT_S,
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT_S,
) -> AsyncIterator[Host]:
    """A running Host listening on `listen` (multiaddrs or host:port; default `listen_host:port`) for libp2p
    and on the same hosts' `tensor_port` for the tensor channel (None: `addresses.default_tensor_port`).

    Its advertised addresses (`Host.addrs`, and what identify tells) are
    `announce` when given, else the listen addresses with 0.0.0.0 / ::
    expanded to this machine's interface addresses (addresses.py).
    A port given (not 0) that something already listens on raises
    `PortInUse` before anything starts (startup.py says why py-libp2p's
    SO_REUSEPORT needs this probe); so does a libp2p host that ends up
    listening on no address.  `bootstrap` multiaddrs are dialled once before
    the DHT starts; a failed bootstrap dial is logged, not fatal (the node's
    own retries are bootstrap.py's).  Everything started here stops when the
    block exits.  A bad address raises `addresses.AddressError`.
    """
    eps = listen_endpoints(listen, listen_host, port)
    announced = [parse_announce(a) for a in announce]
    tport = default_tensor_port(eps[0].port) if tensor_port is None else tensor_port
    tensor_hosts = list(dict.fromkeys(e.host for e in eps))
    probe_ports(eps, tensor_hosts, tport)
    lp = new_libp2p_host(state_dir, eps, announced)
    links = links if links is not None else LinkShaper()
    async with lp.run(listen_addrs=[Multiaddr(e.multiaddr) for e in eps]), trio.open_nursery() as nursery:
        check_listening(lp, eps)
        await own_connections(lp)
        listeners, tport = await open_tensor_listeners(tensor_hosts, tport)
        told = announced[0].host if announced else eps[0].host
        host = Host(
            lp, nursery, Endpoint(told, tport).hostport, links=links, max_payload=max_payload,
            send_timeout=send_timeout, handshake_timeout=handshake_timeout, frame_timeout=frame_timeout)
        await _serve(host, lp, nursery, listeners, links)
        try:
            await _start_services(host, lp, nursery, relay_service=relay_service, dht=dht, bootstrap=bootstrap)
            yield host
        finally:
            links.detach()
            for sender in host._tensor_out.values():
                sender.close()
            nursery.cancel_scope.cancel()


async def _serve(host: Host, lp: IHost, nursery: trio.Nursery, listeners: list[trio.SocketListener],
                 links: LinkShaper) -> None:
    """Take incoming connections and streams: the gwtf protocols on libp2p, the tensor channel on `listeners`."""
    lp.get_network().register_notifee(ConnectionBound())
    lp.set_stream_handler(CTRL_PROTOCOL_ID, host._on_ctrl_stream)
    lp.set_stream_handler(PAYLOAD_PROTOCOL_ID, host._on_ctrl_stream)  # frames are frames: the same reader
    lp.set_stream_handler(TENSOR_PROTOCOL_ID, host._on_tensor_handshake)
    await nursery.start(trio.serve_listeners, host._on_tensor_conn, listeners)
    links.attach(nursery)


async def _start_services(host: Host, lp: IHost, nursery: trio.Nursery, *, relay_service: bool, dht: bool,
                          bootstrap: Iterable[str]) -> None:
    """Dial-back answers, circuit relaying where it helps, the DHT, and the bootstrap peers dialled once."""
    lp.set_stream_handler(DIALBACK_PROTOCOL_ID, dialback_serve)  # (answered by any node)
    if relay_service or routable(host.addrs):  # serve as a relay, or reach peers (and be reached) through one
        host.relaying = Relaying(lp, relay_service, on_addrs_changed=lambda: host.on_addrs_changed(),
                                 on_upgraded=host.rehome_streams)
        await nursery.start(host.relaying.run)
    if dht:
        host.dht = SpreadDHT(lp, DHTMode.SERVER)
        host.dht.register_validator(DHT_NAMESPACE, VersionedValidator())
    for addr in bootstrap:
        try:
            await host.connect(addr)
        except PeerUnreachable as e:
            log.warning("bootstrap peer unreachable: %s", e)
    if dht:
        await nursery.start(host.start_dht)


__all__ = ["CTRL_PROTOCOL_ID", "DHT_NAMESPACE", "DHT_QUERY_TIMEOUT_S", "Host", "PAYLOAD_PROTOCOL_ID", "PeerUnreachable",
           "TENSOR_PROTOCOL_ID", "VersionedValidator", "open_host", "pack_record", "unpack_record"]
