"""Transport layer on loopback: identity, frames, host send/receive, tensor channel, links, all-reduce, DHT.

Real py-libp2p hosts in one trio process; every wait is bounded by a
deadline (`fail_after`); hosts are closed by their `async with`.  Waiting
for an effect that has no event of its own (a log line, a closed socket)
polls under a deadline; timing assertions are lower bounds only.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import torch
import trio

from gwtf_node.protocol.codec import decode, encode
from gwtf_node.protocol.messages import AllReduceChunk, Ping, TensorHeader
from gwtf_node.runtime.net import channel
from gwtf_node.runtime.node.allreduce import AllReduceError, AllReducer, AllReduceTimeout
from gwtf_node.runtime.net.frames import FrameError, encode_header, read_frame
from gwtf_node.runtime.net.host import CTRL_PROTOCOL_ID, TENSOR_PROTOCOL_ID, PeerUnreachable, _libp2p_reader, open_host
from gwtf_node.runtime.net.identity import IdentityError, key_path, load_or_create_identity, peer_id_of
from gwtf_node.runtime.net.links import LinkShaper
from support.helpers import until

DEADLINE_S = 20


class Inbox:
    """Collects frames delivered to a host's handler."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, bytes, bytes]] = []
        self.changed = trio.Event()

    async def handler(self, peer: str, envelope: bytes, payload) -> None:
        self.frames.append((peer, envelope, bytes(payload)))
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, n: int) -> None:
        while len(self.frames) < n:
            await self.changed.wait()


async def closed_by_peer(conn: channel.RawConn) -> bool:
    """True once the other end closed (FIN, or RST when it left our bytes unread)."""
    try:
        return await conn.recv_some(1) == b""
    except ConnectionResetError:
        return True


@asynccontextmanager
async def hosts(tmp_path: Path, n: int, **kw):
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(open_host(tmp_path / "h0", **kw))
        out = [first]
        for i in range(1, n):
            out.append(await stack.enter_async_context(open_host(tmp_path / f"h{i}", bootstrap=first.addrs, **kw)))
        yield out


# ---- identity ----------------------------------------------------------------------


def test_identity_persists_with_private_permissions(tmp_path):
    a = load_or_create_identity(tmp_path / "state")
    b = load_or_create_identity(tmp_path / "state")
    assert peer_id_of(a) == peer_id_of(b)
    assert stat.S_IMODE(os.stat(key_path(tmp_path / "state")).st_mode) == 0o600
    assert peer_id_of(load_or_create_identity(tmp_path / "other")) != peer_id_of(a)


def test_corrupt_identity_is_a_clear_error(tmp_path):
    load_or_create_identity(tmp_path)
    key_path(tmp_path).write_bytes(b"not a key")
    with pytest.raises(IdentityError, match="corrupt"):
        load_or_create_identity(tmp_path)


@pytest.mark.trio
async def test_restarted_host_keeps_peer_id(tmp_path):
    async with open_host(tmp_path / "a", dht=False) as h:
        first = h.peer_id
    async with open_host(tmp_path / "a", dht=False) as h:
        assert h.peer_id == first
        assert all(a.endswith(f"/p2p/{first}") for a in h.addrs)


# ---- frames --------------------------------------------------------------------------


@pytest.mark.trio
async def test_read_frame_limits_and_truncation():
    def reader(data: bytes):
        pos = [0]

        async def read_some(n: int) -> bytes:
            chunk = data[pos[0]:pos[0] + min(n, 5)]
            pos[0] += len(chunk)
            return chunk
        return read_some

    good = encode_header(3, 4) + b"env" + b"\x01\x02\x03\x04"
    assert await read_frame(reader(good)) == (b"env", bytearray(b"\x01\x02\x03\x04"))
    assert await read_frame(reader(b"")) is None
    with pytest.raises(FrameError, match="exceeds"):
        await read_frame(reader(struct.pack(">IQ", (1 << 20) + 1, 0)))
    with pytest.raises(FrameError, match="exceeds"):
        await read_frame(reader(struct.pack(">IQ", 3, 1 << 40)), max_payload=1 << 20)
    with pytest.raises(FrameError, match="truncated"):
        await read_frame(reader(good[:-1]))


# ---- host ----------------------------------------------------------------------------


@pytest.mark.trio
async def test_control_frames_and_payload(tmp_path):
    with trio.fail_after(DEADLINE_S):
        async with hosts(tmp_path, 2, dht=False) as (a, b):
            inbox = Inbox()
            b.set_handler(inbox.handler)
            payload = os.urandom(4 << 20)
            await a.send(b.peer_id, encode(a.peer_id, Ping(nonce=1)))
            await a.send(b.peer_id, encode(a.peer_id, Ping(nonce=2)), payload)
            await a.send(b.peer_id, encode(a.peer_id, Ping(nonce=3)))
            await inbox.wait_for(3)
            by_nonce = {decode(env)[1].nonce: (peer, data) for peer, env, data in inbox.frames}
            assert by_nonce[1] == (a.peer_id, b"")
            assert by_nonce[2] == (a.peer_id, payload)
            assert by_nonce[3] == (a.peer_id, b"")
            # and back, on B's own outgoing stream and channel
            back = Inbox()
            a.set_handler(back.handler)
            await b.send(a.peer_id, b"reply", payload[:1000])
            await back.wait_for(1)
            assert back.frames[0] == (b.peer_id, b"reply", payload[:1000])


@pytest.mark.trio
async def test_a_payload_send_cancelled_mid_frame_does_not_poison_the_next_frames(tmp_path):
    """The caller gives up a big payload frame half-way (an all-reduce round cancelled because another member
    died): the frames after it reach the peer intact, on a new tensor channel, and nothing is refused."""
    with trio.fail_after(DEADLINE_S):
        async with hosts(tmp_path, 2, dht=False) as (a, b):
            inbox = Inbox()
            b.set_handler(inbox.handler)
            await a.send(b.peer_id, b"first", b"x" * 1000)  # the channel is open and carries frames
            await inbox.wait_for(1)
            assert a.payload_path(b.peer_id) == "channel"
            big = bytes(128 << 20)
            with trio.move_on_after(0.05) as scope:
                await a.send(b.peer_id, b"big", big)
            assert scope.cancelled_caught, "the big frame left before the cancel: make it bigger"
            await a.send(b.peer_id, b"after", b"y" * 1000)
            while not any(env == b"after" for _, env, _ in inbox.frames):
                await inbox.changed.wait()
            assert [env for _, env, _ in inbox.frames] == [b"first", b"after"]
            assert inbox.frames[-1][2] == b"y" * 1000
            assert b.stats["refused"] == 0


@pytest.mark.trio
@pytest.mark.parametrize(
    "bad, reason",
    [
        (struct.pack(">IQ", (1 << 20) + 1, 0), "exceeds"),  # oversized length prefix
        (encode_header(100, 0) + b"x" * 10, "truncated"),  # sender dies mid-frame
        (b"\xff" * 64, "exceeds"),  # garbage
    ],
)
async def test_bad_control_frames_are_refused_and_host_keeps_working(tmp_path, caplog, bad, reason):
    caplog.set_level(logging.WARNING, logger="gwtf.transport")
    with trio.fail_after(DEADLINE_S):
        async with hosts(tmp_path, 2, dht=False) as (a, b):
            inbox = Inbox()
            b.set_handler(inbox.handler)
            await a.send(b.peer_id, b"first")  # connects
            stream = await a.libp2p.new_stream(b.libp2p.get_id(), [CTRL_PROTOCOL_ID])
            await stream.write(bad)
            await stream.close()
            await until(lambda: b.stats["refused"] >= 1, "refusal")
            assert any(reason in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)
            await a.send(b.peer_id, b"after")
            await a.send(b.peer_id, b"after-payload", b"\x07" * 100_000)
            await inbox.wait_for(3)
            assert [f[1] for f in inbox.frames] == [b"first", b"after", b"after-payload"]


# ---- tensor channel ----------------------------------------------------------------------


async def _manual_channel(a, b) -> tuple[channel.TensorSender, channel.SessionKeys]:
    """A's end of a channel to B, opened by hand (so a test can write raw records on it)."""
    await a.connect(b.addrs[0])
    stream = await a.libp2p.new_stream(b.libp2p.get_id(), [TENSOR_PROTOCOL_ID])
    keys, addr = await channel.initiate(lambda n: _libp2p_reader(stream, n), stream.write, a.peer_id, b.peer_id)
    await stream.close()
    return await channel.TensorSender.open(addr, keys, b.peer_id, timeout=5), keys


@pytest.mark.trio
async def test_channel_refuses_tampered_record(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="gwtf.transport")
    with trio.fail_after(DEADLINE_S):
        async with hosts(tmp_path, 2, dht=False) as (a, b):
            inbox = Inbox()
            b.set_handler(inbox.handler)
            sender, _keys = await _manual_channel(a, b)
            payload = memoryview(os.urandom(3 * channel.CHUNK_BYTES))
            await sender.send_frame(encode_header(2, len(payload)), b"ok", payload)  # an honest frame
            await inbox.wait_for(1)
            # now a frame whose second payload record has one bit flipped
            out = memoryview(sender._buf)
            n = sender._sealer.seal_into(encode_header(3, len(payload)) + b"bad", out)
            await sender.conn.send_all(bytes(out[:n]))
            for i in range(3):
                n = sender._sealer.seal_into(payload[i * channel.CHUNK_BYTES:(i + 1) * channel.CHUNK_BYTES], out)
                rec = bytearray(out[:n])
                if i == 1:
                    rec[100] ^= 0x01
                await sender.conn.send_all(rec)
            await until(lambda: any("failed authentication" in r.getMessage() for r in caplog.records), "refusal")
            assert [f[1] for f in inbox.frames] == [b"ok"]  # the tampered frame never reached the handler
            assert await closed_by_peer(sender.conn)  # B closed the connection
            sender.close()
            await a.send(b.peer_id, b"still-fine", b"\x01" * 2_000_000)  # the host's own channel works
            await inbox.wait_for(2)
            assert inbox.frames[1][1:] == (b"still-fine", b"\x01" * 2_000_000)


@pytest.mark.trio
async def test_channel_refuses_connections_without_handshake(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="gwtf.transport")
    with trio.fail_after(DEADLINE_S):
        async with hosts(tmp_path, 2, dht=False, handshake_timeout=0.5) as (a, b):
            host, _, port = b.tensor_addr.rpartition(":")
            # 1. an unknown session id and garbage
            conn = await channel.RawConn.connect(host, int(port))
            await conn.send_all(os.urandom(200))
            assert await closed_by_peer(conn)
            conn.close()
            # 2. connected, says nothing: dropped after the handshake timeout
            conn = await channel.RawConn.connect(host, int(port))
            assert await closed_by_peer(conn)
            conn.close()
            # 3. a session id can be used once only (replayed connection)
            sender, keys = await _manual_channel(a, b)
            conn = await channel.RawConn.connect(host, int(port))
            await conn.send_all(keys.session_id + os.urandom(64))
            assert await closed_by_peer(conn)
            conn.close()
            sender.close()
            messages = [r.getMessage() for r in caplog.records]
            assert sum("unknown or already used session id" in m for m in messages) == 2
            assert any("not complete in time" in m for m in messages)
            inbox = Inbox()
            b.set_handler(inbox.handler)
            await a.send(b.peer_id, b"works", b"\x02" * 10)
            await inbox.wait_for(1)


# ---- link shaping ------------------------------------------------------------------------


@pytest.mark.trio
async def test_a_payload_from_the_channel_says_how_long_it_took(tmp_path):
    """The link meter folds the real traffic into a link's bandwidth (linkmeter.py `observe`): each payload off
    the tensor channel carries the seconds from its frame's first byte to its last."""
    with trio.fail_after(DEADLINE_S):
        async with hosts(tmp_path, 2, dht=False) as (a, b):
            got = []

            async def handler(peer, envelope, payload):
                got.append((len(payload), getattr(payload, "seconds", None)))
            b.set_handler(handler)
            await a.send(b.peer_id, b"big", os.urandom(8 << 20))
            await until(lambda: got, "the payload delivered", DEADLINE_S)
            size, seconds = got[0]
            assert size == 8 << 20 and seconds is not None and 0 < seconds < DEADLINE_S


@asynccontextmanager
async def _warm_pair(tmp_path, links: LinkShaper):
    """Host a (sending through `links`) connected to host b, whose frames land in the inbox yielded; one frame
    already sent unshaped, so that stream and channel are open before a link is shaped."""
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_host(tmp_path / "a", dht=False, links=links))
        b = await stack.enter_async_context(open_host(tmp_path / "b", dht=False, bootstrap=a.addrs))
        await a.connect(b.addrs[0])
        inbox = Inbox()
        b.set_handler(inbox.handler)
        await a.send(b.peer_id, b"warm-up", b"\x00" * 10)
        await inbox.wait_for(1)
        yield a, b, inbox


@pytest.mark.trio
async def test_link_shaper_adds_latency_and_bandwidth(tmp_path):
    with trio.fail_after(DEADLINE_S):
        links = LinkShaper()
        async with _warm_pair(tmp_path, links) as (a, b, inbox):
            links.set_link(b.peer_id, latency_ms=150, bandwidth_mbps=100)
            t0 = trio.current_time()
            await a.send(b.peer_id, b"ctrl")
            await inbox.wait_for(2)
            assert trio.current_time() - t0 >= 0.150
            t0 = trio.current_time()
            await a.send(b.peer_id, b"payload", b"\x00" * 2_500_000)  # 20 Mbit: >= 0.2 s at 100 Mbit/s
            await inbox.wait_for(3)
            assert trio.current_time() - t0 >= 0.150 + 0.2
            assert [f[1] for f in inbox.frames] == [b"warm-up", b"ctrl", b"payload"]


@pytest.mark.trio
async def test_a_control_frame_is_not_held_behind_a_shaped_tensor(tmp_path):
    """Control and tensor frames travel in lanes of their own (links.py): a ping sent while a large gradient
    crosses a slow emulated link arrives first, as it would over a real uplink the two connections share."""
    with trio.fail_after(DEADLINE_S):
        links = LinkShaper()
        async with _warm_pair(tmp_path, links) as (a, b, inbox):
            links.set_link(b.peer_id, latency_ms=10, bandwidth_mbps=10)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.send, b.peer_id, b"gradient", b"\x00" * 2_500_000)  # 2 s at 10 Mbit/s
                await trio.sleep(0.1)
                await a.send(b.peer_id, b"ping")
                await inbox.wait_for(3)
            assert [f[1] for f in inbox.frames] == [b"warm-up", b"ping", b"gradient"]


# ---- all-reduce ----------------------------------------------------------------------------


def _reducer_handler(reducer: AllReducer):
    async def handler(peer, envelope, payload):
        _sender, msg = decode(envelope)
        if reducer.accepts(msg):
            await reducer.on_chunk(peer, msg, payload)
    return handler


@asynccontextmanager
async def reducing_hosts(tmp_path: Path):
    """Three connected hosts (no DHT), each with an `AllReducer` serving its chunks: yields (hosts, reducers)."""
    async with hosts(tmp_path, 3, dht=False) as hs:
        for h in hs[1:]:
            await hs[0].connect(h.addrs[0])
        await hs[1].connect(hs[2].addrs[0])
        reducers = [AllReducer(h) for h in hs]
        for h, r in zip(hs, reducers):
            h.set_handler(_reducer_handler(r))
        yield hs, reducers


@pytest.mark.trio
async def test_all_reduce_three_hosts_exact_and_identical(tmp_path):
    with trio.fail_after(DEADLINE_S):
        async with reducing_hosts(tmp_path) as (hs, reducers):
            group = [h.peer_id for h in hs]
            gen = torch.Generator().manual_seed(0)
            tensors = {h.peer_id: torch.randn(1_000_003, generator=gen) for h in hs}
            counts = {h.peer_id: float(i + 1) for i, h in enumerate(hs)}
            results = {}

            async def run(h, r, delay):
                await trio.sleep(delay)  # staggered starts: early chunks get buffered
                results[h.peer_id] = await r.all_reduce("s1/it1", group, tensors[h.peer_id], counts[h.peer_id], 10)

            async with trio.open_nursery() as nursery:
                for i, (h, r) in enumerate(zip(hs, reducers)):
                    nursery.start_soon(run, h, r, 0.1 * i)
            order = sorted(group)
            expected = tensors[order[0]].clone()
            for p in order[1:]:
                expected += tensors[p]
            for pid, (t, c) in results.items():
                assert torch.equal(t, expected), pid
                assert c == 6.0


@pytest.mark.trio
async def test_a_chunk_whose_send_fails_is_sent_again_and_the_round_still_sums(tmp_path):
    """A send that fails (a connection broken under a loaded machine) does not fail the round: the chunk goes
    again until the round's timeout, and every member still ends with the same sum."""
    from gwtf_node.runtime.net.host import PeerUnreachable

    with trio.fail_after(DEADLINE_S):
        async with reducing_hosts(tmp_path) as (hs, reducers):
            group = [h.peer_id for h in hs]
            tensors = {h.peer_id: torch.full((10,), float(i + 1)) for i, h in enumerate(hs)}
            real_send, failures = hs[0].send, [2]

            async def flaky_send(peer_id, envelope, payload=b"", **kw):
                if peer_id == hs[1].peer_id and failures[0] > 0:
                    failures[0] -= 1
                    raise PeerUnreachable("payload frame failed: injected")
                return await real_send(peer_id, envelope, payload, **kw)

            hs[0].send = flaky_send
            results = {}

            async def run(h, r):
                results[h.peer_id] = await r.all_reduce("s1/it1", group, tensors[h.peer_id], 1.0, 10)

            async with trio.open_nursery() as nursery:
                for h, r in zip(hs, reducers):
                    nursery.start_soon(run, h, r)
            assert failures == [0] and reducers[0].send_retries == 2
            for t, c in results.values():
                assert torch.equal(t, torch.full((10,), 6.0)) and c == 3.0


@pytest.mark.trio
@pytest.mark.parametrize("lost", ["phase 1 to its owner", "the owner's sum to a member"])
async def test_a_chunk_lost_after_its_send_is_asked_for_again(tmp_path, lost):
    """A chunk that leaves but never arrives (its connection reset under it): the member still missing an owner's
    sum sends that owner its part again, and an owner that already has it sends its sum again, so the round sums
    within seconds instead of waiting out its timeout."""
    from gwtf_node.protocol.codec import decode
    from gwtf_node.runtime.node.allreduce import GATHER, REDUCE

    with trio.fail_after(DEADLINE_S):
        async with reducing_hosts(tmp_path) as (hs, reducers):
            group = [h.peer_id for h in hs]
            owner = sorted(group)[1]  # the owner of part 1
            src, dst, phase = ((hs[0].peer_id if hs[0].peer_id != owner else hs[2].peer_id), owner, REDUCE) \
                if lost.startswith("phase 1") else (owner, next(p for p in group if p != owner), GATHER)
            sender = next(h for h in hs if h.peer_id == src)
            real_send, dropped = sender.send, []

            async def lossy_send(peer_id, envelope, payload=b"", **kw):
                _s, msg = decode(envelope)
                if peer_id == dst and msg.phase == phase and not dropped:
                    dropped.append(msg.part)
                    return None  # "sent": lost on the way
                return await real_send(peer_id, envelope, payload, **kw)

            sender.send = lossy_send
            tensors = {h.peer_id: torch.full((12,), float(i + 1)) for i, h in enumerate(hs)}
            for r in reducers:
                r.resend_after_s = 0.5
            results = {}

            async def run(h, r):
                results[h.peer_id] = await r.all_reduce("s1/it1", group, tensors[h.peer_id], 1.0, 30)

            t0 = trio.current_time()
            async with trio.open_nursery() as nursery:
                for h, r in zip(hs, reducers):
                    nursery.start_soon(run, h, r)
            assert dropped and trio.current_time() - t0 < 10
            for t, c in results.values():
                assert torch.equal(t, torch.full((12,), 6.0)) and c == 3.0
            assert sum(r.resends for r in reducers) >= 1
            if phase == GATHER:
                assert next(r for h, r in zip(hs, reducers) if h.peer_id == owner).answered_again >= 1


@pytest.mark.trio
async def test_a_cancelled_round_runs_again_under_its_key_with_what_came(tmp_path):
    """A member's round is cancelled (regroup.py: a member presumed dead, then back as it was) and run again
    under the same key: not refused as a finished key, and the chunks that came meanwhile still count."""
    with trio.fail_after(DEADLINE_S):
        async with reducing_hosts(tmp_path) as (hs, reducers):
            group = [h.peer_id for h in hs]
            tensors = {h.peer_id: torch.full((12,), float(i + 1)) for i, h in enumerate(hs)}
            results = {}

            async def run(h, r):
                results[h.peer_id] = await r.all_reduce("s1/it1", group, tensors[h.peer_id], 1.0, 30)

            with trio.move_on_after(0.5):  # hs[0] alone: its round waits, then is cancelled
                await run(hs[0], reducers[0])
            assert hs[0].peer_id not in results
            async with trio.open_nursery() as nursery:
                for h, r in zip(hs, reducers):
                    nursery.start_soon(run, h, r)
            for t, c in results.values():
                assert torch.equal(t, torch.full((12,), 6.0)) and c == 3.0
            with pytest.raises(AllReduceError, match="already ran"):  # a round that summed is not run again
                await run(hs[0], reducers[0])


@pytest.mark.trio
async def test_a_bfloat16_all_reduce_sends_half_and_is_identical_on_every_member(tmp_path, caplog):
    """`wire="bfloat16"`: every contribution rounded once, summed in float32 in sorted-peer order, the sum rounded;
    the same bits everywhere, half the bytes of float32; a float32 chunk in a bfloat16 round is refused."""
    caplog.set_level(logging.WARNING, logger="gwtf.transport")
    with trio.fail_after(DEADLINE_S):
        async with reducing_hosts(tmp_path) as (hs, reducers):
            group = [h.peer_id for h in hs]
            gen = torch.Generator().manual_seed(1)
            tensors = {h.peer_id: torch.randn(100_003, generator=gen) for h in hs}
            results = {}

            async def run(h, r, key, wire):
                results[(key, h.peer_id)] = await r.all_reduce(key, group, tensors[h.peer_id], 1.0, 10, wire=wire)

            for key, wire in (("bf", "bfloat16"), ("fp", "float32")):
                async with trio.open_nursery() as nursery:
                    for h, r in zip(hs, reducers):
                        nursery.start_soon(run, h, r, key, wire)
                sent = [r.last_round["sent_mb"] for r in reducers]
                if wire == "bfloat16":
                    bf_sent = sent
                else:
                    assert sent == pytest.approx([2 * b for b in bf_sent], rel=1e-2)
            order = sorted(group)
            expected = tensors[order[0]].bfloat16().float()
            for p in order[1:]:
                expected += tensors[p].bfloat16().float()
            expected = expected.bfloat16().float()
            exact = sum(tensors[p] for p in order)
            for h in hs:
                t, c = results[("bf", h.peer_id)]
                assert torch.equal(t, expected), h.peer_id
                assert c == 3.0
                assert not torch.equal(t, results[("fp", h.peer_id)][0])  # (it did round)
                assert float((t - exact).abs().max()) <= 0.05 * float(exact.abs().max())
            # a float32 chunk for a bfloat16 round: refused once the round starts (sent for the part hs[0] owns)
            pair = sorted([hs[0].peer_id, hs[1].peer_id])
            await reducers[0].on_chunk(hs[1].peer_id, AllReduceChunk("mixed", pair.index(hs[0].peer_id), 1, 1.0,
                                                                     TensorHeader("float32", (4,), 16)),
                                       bytearray(torch.ones(4).numpy().tobytes()))
            with pytest.raises(AllReduceTimeout):
                await reducers[0].all_reduce("mixed", pair, torch.ones(8), 1.0, 0.5, wire="bfloat16")
            assert any("dtype float32, the round's is bfloat16" in r.getMessage() for r in caplog.records)


@pytest.mark.trio
async def test_all_reduce_timeout_names_missing_peer_and_bad_chunks_refused(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="gwtf.transport")
    with trio.fail_after(DEADLINE_S):
        async with reducing_hosts(tmp_path) as (hs, reducers):
            silent = hs[2].peer_id
            bad = torch.tensor([float("nan")] * 4)
            await reducers[0].on_chunk(
                hs[1].peer_id,
                AllReduceChunk("k", 0, 1, 1.0, TensorHeader("float32", (4,), 16)),
                bytearray(bad.numpy().tobytes()),
            )
            assert any("NaN" in r.getMessage() for r in caplog.records)
            big = torch.zeros(20_000)  # (over INLINE_CHECK_BYTES: checked in the worker thread)
            big[12_345] = float("inf")
            await reducers[0].on_chunk(hs[1].peer_id, AllReduceChunk("k", 0, 1, 1.0, TensorHeader(
                "float32", (20_000,), 80_000)), bytearray(big.numpy().tobytes()))
            assert sum("NaN" in r.getMessage() for r in caplog.records) == 2
            group = [h.peer_id for h in hs]
            errors: list[AllReduceTimeout] = []

            async def run(r):
                try:
                    await r.all_reduce("k", group, torch.ones(10), 1.0, 1.0)
                except AllReduceTimeout as e:
                    errors.append(e)

            async with trio.open_nursery() as nursery:  # hs[2] never takes part
                nursery.start_soon(run, reducers[0])
                nursery.start_soon(run, reducers[1])
            assert len(errors) == 2
            for e in errors:
                assert silent in e.missing
                assert silent in str(e)


# ---- DHT -------------------------------------------------------------------------------------


@pytest.mark.trio
async def test_dht_versioned_record_highest_wins(tmp_path):
    with trio.fail_after(DEADLINE_S * 2):
        async with hosts(tmp_path, 3) as (a, b, c):
            await a.dht_put("run/leader", b"old", version=5)
            assert await c.dht_get_record("run/leader") == (5, b"old")
            await b.dht_put("run/leader", b"new", version=7)
            for h in (a, b, c):
                assert await h.dht_get_record("run/leader") == (7, b"new")
            await c.provide("stage/1")
            providers = await a.find_providers("stage/1")
            assert c.peer_id in [p for p, _addrs in providers]


async def _first_frame(a, b, inbox: Inbox):
    """`b` sends `a` a first frame, which `inbox` receives: `b`'s network and its one connection to `a`."""
    from libp2p.peer.id import ID

    a.set_handler(inbox.handler)
    await b.send(a.peer_id, b"first")
    await inbox.wait_for(1)
    network = b.libp2p.get_network()
    (conn,) = network.get_connections(ID.from_base58(a.peer_id))
    return network, conn


@pytest.mark.trio
async def test_a_connection_that_opens_no_stream_is_closed_and_the_frame_goes_on_a_new_one(tmp_path):
    """py-libp2p keeps a connection listed that opens no stream any more (closed under it, or refusing): the send
    closes it and dials anew, instead of failing until liveness presumes the peer dead."""
    from libp2p.peer.id import ID

    with trio.fail_after(DEADLINE_S):
        async with hosts(tmp_path, 2, dht=False) as (a, b):
            inbox = Inbox()
            network, conn = await _first_frame(a, b, inbox)

            async def refuses():
                raise RuntimeError("this connection opens no stream")

            conn.new_stream = refuses  # (what a connection broken under the swarm's table does)
            await b._drop_stream(b._ctrl_out, a.peer_id)  # the next frame needs a new stream
            await b.send(a.peer_id, b"second")
            await inbox.wait_for(2)
            assert [env for _, env, _ in inbox.frames] == [b"first", b"second"]
            assert b.stats["stale_closed"] == 1 and conn not in network.get_connections(ID.from_base58(a.peer_id))


@pytest.mark.trio
async def test_a_connection_whose_stream_negotiation_goes_unanswered_is_closed_and_the_frame_goes_on_a_new_one(
        tmp_path):
    """The peer no longer reads a connection (it dropped it under load) that libp2p still lists: a stream opens on
    it, but its protocol negotiation times out (`StreamFailure`).  The send closes it and dials anew; before, every
    frame to that peer failed so, 10 s each, and the peer, never hearing this node, kept it presumed dead."""
    from libp2p.peer.id import ID
    from libp2p.protocol_muxer.exceptions import MultiselectClientError

    with trio.fail_after(DEADLINE_S):
        async with hosts(tmp_path, 2, dht=False) as (a, b):
            inbox = Inbox()
            network, conn = await _first_frame(a, b, inbox)
            client = b.libp2p.multiselect_client
            select = client.select_one_of

            async def unanswered(protocols, communicator, timeout=None):
                if communicator.read_writer.muxed_conn is conn.muxed_conn:
                    raise MultiselectClientError("response timed out after 10s")
                return await select(protocols, communicator, timeout)

            client.select_one_of = unanswered
            await b._drop_stream(b._ctrl_out, a.peer_id)  # the next frame needs a new stream
            await b.send(a.peer_id, b"second")
            await inbox.wait_for(2)
            assert [env for _, env, _ in inbox.frames] == [b"first", b"second"]
            assert b.stats["stale_closed"] == 1 and conn not in network.get_connections(ID.from_base58(a.peer_id))


@pytest.mark.trio
async def test_a_connection_a_frame_came_in_on_recently_is_kept_when_no_stream_opens_on_it(tmp_path, monkeypatch):
    """The peer talks to us on it: the connection works and the peer is slow (its stream negotiation timed out), so
    the send fails without closing it (closing would fail the peer's frames in flight); once nothing came on it
    for `ALIVE_S`, it is closed and the frame goes on a new one."""
    from libp2p.peer.id import ID

    import gwtf_node.runtime.net.host as host_mod

    with trio.fail_after(DEADLINE_S):
        async with hosts(tmp_path, 2, dht=False) as (a, b):
            inbox_a, inbox_b = Inbox(), Inbox()
            a.set_handler(inbox_a.handler)
            b.set_handler(inbox_b.handler)
            await b.send(a.peer_id, b"first")
            await inbox_a.wait_for(1)
            await a.send(b.peer_id, b"from a")  # on the same connection: b heard a frame on it just now
            await inbox_b.wait_for(1)
            network = b.libp2p.get_network()
            (conn,) = network.get_connections(ID.from_base58(a.peer_id))

            async def refuses():
                raise RuntimeError("no stream opens in time")

            conn.new_stream = refuses
            await b._drop_stream(b._ctrl_out, a.peer_id)
            with pytest.raises(PeerUnreachable):
                await b.send(a.peer_id, b"second")
            assert network.get_connections(ID.from_base58(a.peer_id)) == [conn] and "stale_closed" not in b.stats
            monkeypatch.setattr(host_mod, "ALIVE_S", 0.0)  # nothing came on it since: closed, and a new one dialled
            await b.send(a.peer_id, b"third")
            await inbox_a.wait_for(2)
            assert [env for _, env, _ in inbox_a.frames] == [b"first", b"third"]
            assert b.stats["stale_closed"] == 1 and conn not in network.get_connections(ID.from_base58(a.peer_id))
