"""The fast tensor channel: authenticated, encrypted frames over a plain TCP socket.

Why: py-libp2p's Noise + Yamux stream is CPU-bound in its pure-Python
framing and several times too slow for an activation of tens of MB per
microbatch, while AES-256-GCM from `cryptography` (OpenSSL, AES-NI) seals
gigabytes per second per core, so encryption is not the bottleneck: the
Python work per byte is.  The channel therefore keeps
libp2p for what it is good at (authenticating peer ids) and moves the bytes
over a socket with a few large system calls per MiB.

Handshake (over libp2p, protocol `/gwtf/tensor/1.0.0`, used only for this):
the libp2p stream is Noise-authenticated, so whatever arrives on it comes
from the remote peer id.

    initiator -> responder:  magic "GWTFTC1\\n" | X25519 ephemeral public (32) | nonce (32)
    responder -> initiator:  X25519 ephemeral public (32) | nonce (32) | u16 len | tensor addr "host:port"

Both sides compute the X25519 secret and run HKDF-SHA256 over it, with the
salt = SHA-256 of the transcript (both peer ids, both ephemeral keys, both
nonces, the advertised address), giving a 32-byte key initiator->responder,
a 32-byte key responder->initiator and a 16-byte session id.  The responder
remembers the pending session for `handshake_timeout` seconds.  The
initiator then opens a TCP connection to the tensor address and sends the
session id followed by a sealed proof record; the responder looks the
session up (once: a session id cannot be reused), opens the proof and answers
with a sealed ack.  Only then does it read frames.  Fresh ephemeral keys per
session give forward secrecy; binding the peer ids into the key derivation
means a key can only be used between those two peers.

Records: every byte after the session id travels in records
`u32 ciphertext length | AES-256-GCM(key, nonce = 96-bit record counter, aad = session id)`.
The counter starts at 0 in each direction and is never sent, so a replayed,
dropped, reordered or tampered record fails authentication and the
connection is closed (logged on "gwtf.transport").  A frame (see frames.py)
is one header record (12-byte frame header + envelope) followed by payload
records of `CHUNK_BYTES` (the last one shorter); the receiver checks the
lengths in the header before allocating, knows the exact size of every
payload record, and decrypts each one straight into the preallocated
payload buffer (`decrypt_into`), so a payload is copied once from the
kernel and once by the cipher.  A channel is one-way (initiator sends
frames); each direction of a peer pair opens its own.

Where the tensor address cannot be dialled (the peer is behind NAT: its
router drops our SYN), `TensorSender.open` raises `ChannelUnreachable` and
the host sends that peer's payloads over the libp2p connection instead
(host.py, `PAYLOAD_PROTOCOL_ID`), slower but always there.

Throughput against a raw socket and a Noise+Yamux stream: docs/bench_transport.md
(scripts/bench_transport.py).  Crypto stays on the event-loop thread: sealing
a 1 MiB record costs less than a `trio.to_thread` round trip.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import struct
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ...protocol.codec import MAX_FRAME_BYTES
from .frames import HEADER_BYTES, FrameError, ReadSome, frame_deadline_s, parse_header, read_exactly

log = logging.getLogger("gwtf.transport")

TENSOR_PROTOCOL_ID = "/gwtf/tensor/1.0.0"  # libp2p protocol carrying the key exchange only
MAGIC = b"GWTFTC1\n"  # first bytes of a handshake: channel protocol version 1
CHUNK_BYTES = 1 << 20  # plaintext bytes per payload record (1 MiB: measured as fast as 4 MiB)
TAG_BYTES = 16  # AES-GCM authentication tag
SESSION_ID_BYTES = 16
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 32  # handshake nonces (not the AES-GCM nonce, which is the record counter)
_LEN = struct.Struct(">I")  # record length prefix
_PROOF = b"gwtf tensor channel proof v1"
_ACK = b"gwtf tensor channel ack v1"
_HKDF_INFO = b"gwtf tensor channel v1"
MAX_HEADER_RECORD_BYTES = HEADER_BYTES + MAX_FRAME_BYTES + TAG_BYTES


class ChannelError(Exception):
    """The tensor channel failed: handshake refused, record not authentic, connection lost."""


class ChannelUnreachable(ChannelError):
    """The peer's tensor address cannot be dialled (refused, no route, or no answer: behind NAT)."""


@dataclass(frozen=True, slots=True)
class SessionKeys:
    session_id: bytes
    initiator_key: bytes  # seals initiator -> responder records
    responder_key: bytes  # seals responder -> initiator records


def _length_prefixed(b: bytes) -> bytes:
    """`b` behind its u16 length, so that the transcript's fields cannot run into each other."""
    return struct.pack(">H", len(b)) + b


def derive_keys(
    shared: bytes,
    initiator: str,
    responder: str,
    init_pub: bytes,
    init_nonce: bytes,
    resp_pub: bytes,
    resp_nonce: bytes,
    tensor_addr: str,
) -> SessionKeys:
    """Directional keys and the session id, bound to both peer ids and the whole transcript."""
    if shared == bytes(len(shared)):
        raise ChannelError("X25519 exchange gave the all-zero secret (a low-order public key was sent)")
    transcript = b"".join(
        [MAGIC, _length_prefixed(initiator.encode()), _length_prefixed(responder.encode()), init_pub, init_nonce, resp_pub, resp_nonce,
         _length_prefixed(tensor_addr.encode())]
    )
    okm = HKDF(
        algorithm=hashes.SHA256(),
        length=SESSION_ID_BYTES + 2 * KEY_BYTES,
        salt=hashlib.sha256(transcript).digest(),
        info=_HKDF_INFO,
    ).derive(shared)
    return SessionKeys(
        session_id=okm[:SESSION_ID_BYTES],
        initiator_key=okm[SESSION_ID_BYTES:SESSION_ID_BYTES + KEY_BYTES],
        responder_key=okm[SESSION_ID_BYTES + KEY_BYTES:],
    )


class RecordSealer:
    """Seals records in order: nonce = counter, aad = session id."""

    def __init__(self, key: bytes, session_id: bytes) -> None:
        self._aead = AESGCM(key)
        self._aad = session_id
        self._counter = 0

    def seal_into(self, plaintext: bytes | memoryview, out: memoryview) -> int:
        """Writes length prefix + ciphertext into `out`; returns the bytes written."""
        n = len(plaintext) + TAG_BYTES
        _LEN.pack_into(out, 0, n)
        self._aead.encrypt_into(self._counter.to_bytes(12, "big"), plaintext, self._aad, out[4:4 + n])
        self._counter += 1
        return 4 + n


class RecordOpener:
    def __init__(self, key: bytes, session_id: bytes) -> None:
        self._aead = AESGCM(key)
        self._aad = session_id
        self._counter = 0

    def open_into(self, ciphertext: memoryview, out: memoryview) -> None:
        try:
            self._aead.decrypt_into(self._counter.to_bytes(12, "big"), ciphertext, self._aad, out)
        except InvalidTag:
            raise ChannelError(
                f"record {self._counter} failed authentication (tampered, replayed, reordered or wrong key)"
            ) from None
        self._counter += 1


# ---- raw socket helpers -----------------------------------------------------


# A read of at least this many bytes asks the kernel to wake us only when all of them (up to RCVLOWAT_MAX) are in.
RCVLOWAT_FROM = 64 * 1024
RCVLOWAT_MAX = 512 * 1024
_LOWAT_WORKS = sys.platform.startswith("linux")  # epoll honours SO_RCVLOWAT on TCP there


class RawConn:
    """A connected trio socket with exact-size reads into caller buffers.

    Wake-ups.  A link shaped by a token bucket (a home uplink's router, `tc tbf`) hands the receiver one TCP
    segment at a time, and a read that waits for readiness would wake once per 1.4-kB segment: about 20,000
    wake-ups of the event loop for a 28-MB all-reduce part, each a task step of tens of microseconds.  A record
    is useless until it is whole, so `recv_into_exactly` of a large record sets `SO_RCVLOWAT` to the bytes still
    missing (at most `RCVLOWAT_MAX`): the kernel signals readiness only once that many are in, and the bytes
    arrive no later than they would have.  It puts the default (1) back before it returns: every other read of the
    socket (the wait for the next frame's header) must wake on the first byte.
    """

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self._lowat = 1  # the socket's SO_RCVLOWAT (the kernel's default)
        self._lowat_ok = _LOWAT_WORKS and sock.type == socket.SOCK_STREAM

    @classmethod
    async def connect(cls, host: str, port: int) -> RawConn:
        sock = trio.socket.socket(trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    async def send_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            sent = await self.sock.send(view)
            view = view[sent:]

    async def recv_into_exactly(self, view: memoryview, what: str) -> None:
        got = 0
        n = len(view)
        try:
            while got < n:
                if self._lowat_ok and n >= RCVLOWAT_FROM:
                    self._set_lowat(min(n - got, RCVLOWAT_MAX))
                k = await self.sock.recv_into(view[got:], n - got)
                if k == 0:
                    raise FrameError(f"connection closed after {got} of {n} bytes of {what}: truncated")
                got += k
        finally:
            if self._lowat != 1:  # (every other read of the socket, the wait for the next frame's, wakes on a byte)
                self._set_lowat(1)

    async def recv_some(self, n: int) -> bytes:
        return await self.sock.recv(n)

    def _set_lowat(self, want: int) -> None:
        if want == self._lowat:
            return
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
        except OSError as e:  # a kernel that refuses it: plain reads, one wake-up per segment
            log.debug("SO_RCVLOWAT %d refused (%s): reading without it", want, e)
            self._lowat_ok = False
            return
        self._lowat = want

    def close(self) -> None:
        self.sock.close()


async def _recv_record_len(conn: RawConn, limit: int, what: str) -> int:
    head = bytearray(4)
    await conn.recv_into_exactly(memoryview(head), what)
    (n,) = _LEN.unpack(head)
    if n < TAG_BYTES or n > limit:
        raise FrameError(f"{what} record of {n} bytes is outside 16..{limit}")
    return n


async def _recv_record(conn: RawConn, opener: RecordOpener, limit: int, what: str) -> bytearray:
    n = await _recv_record_len(conn, limit, what)
    ct = bytearray(n)
    await conn.recv_into_exactly(memoryview(ct), what)
    out = bytearray(n - TAG_BYTES)
    opener.open_into(memoryview(ct), memoryview(out))
    return out


# ---- handshake over the authenticated libp2p stream ------------------------


async def initiate(
    read_some: ReadSome,
    write: Callable[[bytes], Awaitable[None]],
    me: str,
    peer: str,
) -> tuple[SessionKeys, str]:
    """Initiator side of the key exchange; returns the keys and the peer's tensor address."""
    priv = X25519PrivateKey.generate()
    pub = priv.public_key().public_bytes_raw()
    nonce = os.urandom(NONCE_BYTES)
    await write(MAGIC + pub + nonce)
    reply = await read_exactly(read_some, 32 + NONCE_BYTES + 2, "the handshake reply")
    resp_pub, resp_nonce = bytes(reply[:32]), bytes(reply[32:32 + NONCE_BYTES])
    (addr_len,) = struct.unpack(">H", reply[-2:])
    if addr_len == 0 or addr_len > 300:
        raise ChannelError(f"handshake reply has a tensor address of {addr_len} bytes")
    tensor_addr = bytes(await read_exactly(read_some, addr_len, "the tensor address")).decode()
    shared = priv.exchange(X25519PublicKey.from_public_bytes(resp_pub))
    keys = derive_keys(shared, me, peer, pub, nonce, resp_pub, resp_nonce, tensor_addr)
    return keys, tensor_addr


async def respond(
    read_some: ReadSome,
    write: Callable[[bytes], Awaitable[None]],
    me: str,
    peer: str,
    tensor_addr: str,
) -> SessionKeys:
    hello = await read_exactly(read_some, len(MAGIC) + 32 + NONCE_BYTES, "the handshake")
    if bytes(hello[:len(MAGIC)]) != MAGIC:
        raise ChannelError(f"handshake from {peer} does not start with {MAGIC!r}")
    init_pub = bytes(hello[len(MAGIC):len(MAGIC) + 32])
    init_nonce = bytes(hello[len(MAGIC) + 32:])
    priv = X25519PrivateKey.generate()
    pub = priv.public_key().public_bytes_raw()
    nonce = os.urandom(NONCE_BYTES)
    addr = tensor_addr.encode()
    shared = priv.exchange(X25519PublicKey.from_public_bytes(init_pub))
    keys = derive_keys(shared, peer, me, init_pub, init_nonce, pub, nonce, tensor_addr)
    await write(pub + nonce + struct.pack(">H", len(addr)) + addr)
    return keys


# ---- sender ------------------------------------------------------------------


class TensorSender:
    """The initiator's end of one channel: sends frames to one peer, in order."""

    def __init__(self, conn: RawConn, keys: SessionKeys, peer: str) -> None:
        self.conn = conn
        self.peer = peer
        self._sealer = RecordSealer(keys.initiator_key, keys.session_id)
        self._opener = RecordOpener(keys.responder_key, keys.session_id)
        self._session_id = keys.session_id
        self._buf = bytearray(4 + CHUNK_BYTES + TAG_BYTES)
        self.lock = trio.Lock()  # one frame at a time on the socket
        self.broken = False
        self.moved: Callable[[], None] | None = None  # called as each payload record leaves (Host.payload_moved)

    @classmethod
    async def open(cls, tensor_addr: str, keys: SessionKeys, peer: str, timeout: float,
                   connect_timeout: float | None = None) -> TensorSender:
        """Connect and prove the session; `ChannelUnreachable` if the TCP connection is not made (within
        `connect_timeout`, default `timeout`): the caller may send over libp2p instead."""
        host, _, port = tensor_addr.rpartition(":")
        with trio.fail_after(timeout):
            try:
                with trio.fail_after(timeout if connect_timeout is None else connect_timeout):
                    conn = await RawConn.connect(host.strip("[]"), int(port))
            except (OSError, trio.TooSlowError) as e:
                raise ChannelUnreachable(f"{tensor_addr}: {e!r}") from e
            sender = cls(conn, keys, peer)
            try:
                out = memoryview(sender._buf)
                n = sender._sealer.seal_into(_PROOF, out)
                await conn.send_all(keys.session_id + bytes(out[:n]))
                ack = await _recv_record(conn, sender._opener, len(_ACK) + TAG_BYTES, "the channel ack")
                if bytes(ack) != _ACK:
                    raise ChannelError(f"tensor channel to {peer}: unexpected ack")
            except BaseException:
                conn.close()
                raise
        return sender

    async def send_frame(self, header: bytes, envelope: bytes, payload: memoryview, stall_s: float = math.inf) -> None:
        """Sends one frame (header = frames.encode_header(...)); the caller holds `lock`.  `trio.TooSlowError` when
        one record of the payload does not leave within `stall_s` (the receiver stopped reading)."""
        out = memoryview(self._buf)
        head = header + envelope
        if len(head) + TAG_BYTES + 4 <= len(self._buf):
            n = self._sealer.seal_into(head, out)
            await self.conn.send_all(out[:n])
        else:  # an envelope bigger than one chunk (up to 1 MiB + 12): a one-off buffer
            big = memoryview(bytearray(4 + len(head) + TAG_BYTES))
            n = self._sealer.seal_into(head, big)
            await self.conn.send_all(big[:n])
        for off in range(0, len(payload), CHUNK_BYTES):
            n = self._sealer.seal_into(payload[off:off + CHUNK_BYTES], out)
            with trio.fail_after(stall_s):
                await self.conn.send_all(out[:n])
            if self.moved is not None:
                self.moved()

    def close(self) -> None:
        self.broken = True
        self.conn.close()


# ---- receiver ----------------------------------------------------------------

class TimedPayload(bytearray):
    """A payload as it came off the channel, with the seconds from its frame's first byte to its last: what the
    link meter folds into a link's bandwidth (linkmeter.py `observe`)."""

    __slots__ = ("seconds",)


Deliver = Callable[[str, bytes, bytearray], Awaitable[None]]
# session id -> (peer id, keys); pops the session (each id is good for one connection)
ClaimSession = Callable[[bytes], "tuple[str, SessionKeys] | None"]


async def _recv_payload(conn: RawConn, opener: RecordOpener, ct_view: memoryview, pview: memoryview,
                        record_timeout: float, moved: Callable[[], None] | None) -> None:
    """A frame's payload records decrypted into `pview`, each within `record_timeout` (a sender that stopped is not
    waited for); `moved()` after each."""
    for off in range(0, len(pview), CHUNK_BYTES):
        size = min(CHUNK_BYTES, len(pview) - off)
        with trio.fail_after(record_timeout):
            rn = await _recv_record_len(conn, CHUNK_BYTES + TAG_BYTES, "a payload")
            if rn != size + TAG_BYTES:
                raise FrameError(f"payload record of {rn} bytes, expected {size + TAG_BYTES}")
            await conn.recv_into_exactly(ct_view[:rn], "a payload record")
        opener.open_into(ct_view[:rn], pview[off:off + size])
        if moved is not None:
            moved()


async def serve_connection(
    conn: RawConn,
    claim_session: ClaimSession,
    deliver: Deliver,
    *,
    max_payload: int,
    handshake_timeout: float,
    frame_timeout: float,
    moved: Callable[[str], None] | None = None,
) -> None:
    """Responder side of one channel connection: authenticate, then deliver frames until EOF; `moved(peer)` as each
    payload record comes.

    Every failure is logged and closes the connection; nothing is raised to
    the caller for a peer's misbehaviour.
    """
    peer = "?"
    try:
        with trio.fail_after(handshake_timeout):
            sid = bytearray(SESSION_ID_BYTES)
            await conn.recv_into_exactly(memoryview(sid), "the session id")
            claimed = claim_session(bytes(sid))
            if claimed is None:
                raise ChannelError("unknown or already used session id (no libp2p handshake preceded it)")
            peer, keys = claimed
            opener = RecordOpener(keys.initiator_key, keys.session_id)
            sealer = RecordSealer(keys.responder_key, keys.session_id)
            proof = await _recv_record(conn, opener, len(_PROOF) + TAG_BYTES, "the proof")
            if bytes(proof) != _PROOF:
                raise ChannelError("proof record has the wrong contents")
            out = memoryview(bytearray(4 + len(_ACK) + TAG_BYTES))
            n = sealer.seal_into(_ACK, out)
            await conn.send_all(out[:n])
        ct = bytearray(CHUNK_BYTES + TAG_BYTES)
        ct_view = memoryview(ct)
        while True:
            # Idle wait for the next frame is unbounded; the frame itself has a deadline.
            head = bytearray(4)
            k = await conn.sock.recv_into(head, 4)
            if k == 0:
                return  # clean close at a frame boundary
            started = trio.current_time()
            with trio.fail_after(frame_timeout) as whole:  # the header; then the payload's time too (frames.py)
                if k < 4:
                    await conn.recv_into_exactly(memoryview(head)[k:], "a record length")
                (n,) = _LEN.unpack(head)
                if n < TAG_BYTES + HEADER_BYTES or n > MAX_HEADER_RECORD_BYTES:
                    raise FrameError(f"frame header record of {n} bytes is outside "
                                     f"{TAG_BYTES + HEADER_BYTES}..{MAX_HEADER_RECORD_BYTES}")
                hct = bytearray(n)
                await conn.recv_into_exactly(memoryview(hct), "a frame header")
                plain = bytearray(n - TAG_BYTES)
                opener.open_into(memoryview(hct), memoryview(plain))
                envelope_len, payload_len = parse_header(bytes(plain[:HEADER_BYTES]), max_payload)
                if HEADER_BYTES + envelope_len != len(plain):
                    raise FrameError(f"header record holds {len(plain) - HEADER_BYTES} envelope bytes, "
                                     f"the header says {envelope_len}")
                envelope = bytes(plain[HEADER_BYTES:])
                whole.deadline = started + frame_deadline_s(frame_timeout, payload_len)
                payload = TimedPayload(payload_len)
                await _recv_payload(conn, opener, ct_view, memoryview(payload), frame_timeout,
                                    (lambda: moved(peer)) if moved is not None else None)
                payload.seconds = trio.current_time() - started
            await deliver(peer, envelope, payload)
    except (ChannelError, FrameError) as e:
        log.warning("tensor channel from %s refused: %s; connection closed", peer, e)
    except trio.TooSlowError:
        log.warning("tensor channel from %s: handshake or frame not complete in time; connection closed", peer)
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
        log.info("tensor channel from %s lost: %s", peer, e)
    finally:
        conn.close()
