"""A frame's deadline grows with its payload: a stage's state or all-reduce part crosses a slow home uplink, a
sender or reader that stopped is still given up on, and a run's largest state fits the frames a node accepts."""

from __future__ import annotations

import os

import pytest
import torch
import trio

from gwtf_node.model import memory
from gwtf_node.model.hfconfig import family_config
from gwtf_node.model.manifest import default_manifest
from gwtf_node.model.presets import preset_config
from gwtf_node.model.reference import build_chain
from gwtf_node.protocol.codec import decode, encode
from gwtf_node.protocol.messages import Ping
from gwtf_node.runtime.net import channel, frames
from gwtf_node.runtime.net.frames import DEFAULT_MAX_PAYLOAD_BYTES, FrameError, encode_header, read_frame
from gwtf_node.runtime.net.host import PeerUnreachable, open_host

DEADLINE_S = 60.0


def _trickle(data: bytes, step: int, pause_s: float, stall_after: int | None = None):
    """A stream that hands out `step` bytes every `pause_s` seconds (and nothing more after `stall_after`)."""
    pos = [0]

    async def read_some(n: int) -> bytes:
        if stall_after is not None and pos[0] >= stall_after:
            await trio.sleep_forever()
        await trio.sleep(pause_s)
        chunk = data[pos[0]:pos[0] + min(n, step)]
        pos[0] += len(chunk)
        return chunk
    return read_some


@pytest.mark.trio
async def test_a_slow_payload_arrives_and_a_stalled_one_is_refused(autojump_clock):
    payload = os.urandom(2 << 20)
    frame = encode_header(3, len(payload)) + b"env" + payload
    # 64 KiB every 0.1 s: 3.2 s for the payload, past the 1-s frame timeout, within its 1 Mbit/s deadline (17.8 s)
    got = await read_frame(_trickle(frame, 64 << 10, 0.1), frame_timeout=1.0)
    assert got == (b"env", bytearray(payload))
    assert frames.frame_deadline_s(1.0, len(payload)) == pytest.approx(1.0 + len(payload) / 125_000)
    t0 = trio.current_time()
    with pytest.raises(FrameError, match="not complete within 18 s"):
        await read_frame(_trickle(frame, 64 << 10, 0.1, stall_after=1 << 20), frame_timeout=1.0)
    assert trio.current_time() - t0 == pytest.approx(frames.frame_deadline_s(1.0, len(payload)), abs=0.2)


@pytest.fixture
def slow_records(monkeypatch):
    """The tensor channel's sender as over a slow link: every payload record (> 64 KiB) leaves 0.3 s after the
    last; `stall[0]` set: the records after it never leave."""
    real = channel.RawConn.send_all
    state = {"records": 0, "stall_after": None}

    async def send_all(self, data):
        if len(data) > 64 << 10:
            state["records"] += 1
            if state["stall_after"] is not None and state["records"] > state["stall_after"]:
                await trio.sleep_forever()
            await trio.sleep(0.3)
        await real(self, data)

    monkeypatch.setattr(channel.RawConn, "send_all", send_all)
    return state


@pytest.mark.trio
async def test_a_frame_longer_than_the_send_and_frame_timeouts_crosses_the_channel(tmp_path, slow_records):
    """4 MiB at 0.3 s a MiB: 1.2 s on the wire, twice the 0.6-s send and frame timeouts; it arrives whole."""
    kw = dict(dht=False, send_timeout=0.6, frame_timeout=0.6)
    got = trio.Event()
    frames_in = []
    with trio.fail_after(DEADLINE_S):
        async with open_host(tmp_path / "a", **kw) as a, open_host(tmp_path / "b", bootstrap=a.addrs, **kw) as b:
            async def handler(peer, env, data):
                frames_in.append((peer, decode(env)[1], bytes(data)))
                got.set()

            b.set_handler(handler)
            payload = os.urandom(4 << 20)
            await a.send(b.peer_id, encode(a.peer_id, Ping(nonce=7)), payload, wait_delivered=True)
            await got.wait()
            assert frames_in == [(a.peer_id, Ping(nonce=7), payload)]
            assert slow_records["records"] >= 4


@pytest.mark.trio
async def test_a_sender_that_stops_mid_frame_is_given_up_on_by_both_ends(tmp_path, slow_records, caplog):
    # the receiver's frame deadline (0.6 s without progress) comes well before the sender's own give-up (1.5 s
    # for a stalled record): with the two equal, the sender sometimes closes first and the receiver only sees
    # a truncated frame
    kw_a = dict(dht=False, send_timeout=1.5, frame_timeout=0.6)
    kw_b = dict(dht=False, send_timeout=0.6, frame_timeout=0.6)
    slow_records["stall_after"] = 2
    with trio.fail_after(DEADLINE_S):
        async with open_host(tmp_path / "a", **kw_a) as a, open_host(tmp_path / "b", bootstrap=a.addrs, **kw_b) as b:
            b.set_handler(lambda *args: trio.sleep(0))
            t0 = trio.current_time()
            with pytest.raises(PeerUnreachable):
                await a.send(b.peer_id, encode(a.peer_id, Ping(nonce=8)), os.urandom(4 << 20), wait_delivered=True)
            # each try stops within the 1.5-s stall of one record, far before the frame's 34-s deadline
            assert trio.current_time() - t0 < 15.0
            with trio.move_on_after(5.0):
                while "not complete in time" not in caplog.text:
                    await trio.sleep(0.05)
            assert "not complete in time" in caplog.text


def test_a_parts_state_fits_the_largest_frame_the_run_accepts():
    raw = {"model_type": "llama", "vocab_size": 300, "hidden_size": 96, "intermediate_size": 160,
           "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 2}
    family, config, _ = family_config(raw)
    m = default_manifest(family=family, config=config, stages=2, seq_len=16, microbatch_size=1)
    data, relays = build_chain(m)
    for part in (data, *relays):  # with AdamW's moments, as after a step
        for p in part.params:
            p.grad = torch.zeros_like(p)
        part.optimizer.step()
    sizes = [len(part.state_bytes()) for part in (data, *relays)]
    bound = memory.largest_state_bytes(m)
    assert max(sizes) <= bound <= max(sizes) * 1.02 + memory.STATE_FRAMING_BYTES
    # a ~1B model in 4 stages: a part's state (12 bytes a parameter with AdamW) is past the 512-MiB default
    family, config, _ = family_config(preset_config("llama-1b"))
    big = default_manifest(family=family, config=config, stages=4)
    assert memory.largest_state_bytes(big) > 4 * DEFAULT_MAX_PAYLOAD_BYTES


@pytest.mark.trio
async def test_an_all_reduce_over_a_slow_link_outlasts_its_timeout_while_bytes_move(tmp_path, slow_records):
    """Parts of 8 MiB at 0.3 s a MiB: each phase takes ~2.4 s, the round ~5 s, against a timeout of 1.5 s that
    counts from the last payload byte; no part is sent again while its bytes are still moving."""
    from gwtf_node.runtime.node.allreduce import AllReducer

    kw = dict(dht=False, send_timeout=5.0, frame_timeout=5.0)
    with trio.fail_after(DEADLINE_S):
        async with open_host(tmp_path / "a", **kw) as a, open_host(tmp_path / "b", bootstrap=a.addrs, **kw) as b:
            reducers = {}
            for h in (a, b):
                r = reducers[h.peer_id] = AllReducer(h)
                r.resend_after_s = 0.5

                async def handler(peer, env, data, r=r):
                    _s, msg = decode(env)
                    if r.accepts(msg):
                        await r.on_chunk(peer, msg, data)
                h.set_handler(handler)
            group = [a.peer_id, b.peer_id]
            gen = torch.Generator().manual_seed(3)
            tensors = {p: torch.randn(4 << 20, generator=gen) for p in group}
            results = {}

            async def run(h):
                results[h.peer_id] = await reducers[h.peer_id].all_reduce("s0/it0", group, tensors[h.peer_id], 1.0,
                                                                          timeout=1.5)

            t0 = trio.current_time()
            async with trio.open_nursery() as nursery:
                for h in (a, b):
                    nursery.start_soon(run, h)
            assert trio.current_time() - t0 > 3.0  # (the round did outlast its timeout)
            want = tensors[sorted(group)[0]] + tensors[sorted(group)[1]]
            for t, c in results.values():
                assert torch.equal(t, want) and c == 2.0
            assert sum(r.resends for r in reducers.values()) == 0


@pytest.mark.trio
async def test_a_member_that_never_sends_its_sum_ends_the_round_at_its_timeout(tmp_path, monkeypatch):
    """The other member is alive, takes every part sent to it, and never runs the round (a restarted peer): the parts
    sent to it again, every 0.6 s, do not hold the round past its 1.5-s timeout counted from the last byte it sent."""
    from gwtf_node.runtime.node import allreduce
    from gwtf_node.runtime.node.allreduce import AllReducer, AllReduceTimeout

    monkeypatch.setattr(allreduce, "RESEND_MAX_S", 0.3)
    async with open_host(tmp_path / "a", dht=False) as a, open_host(tmp_path / "b", bootstrap=a.addrs, dht=False) as b:
        reducers = {h.peer_id: AllReducer(h) for h in (a, b)}
        got = []
        for h in (a, b):
            async def handler(peer, env, data, r=reducers[h.peer_id]):
                _s, msg = decode(env)
                if r.accepts(msg):
                    got.append(peer)
                    await r.on_chunk(peer, msg, data)
            h.set_handler(handler)
        mine = reducers[a.peer_id]
        mine.resend_after_s = 0.3
        t0 = trio.current_time()
        with trio.fail_after(15.0), pytest.raises(AllReduceTimeout) as e:
            await mine.all_reduce("s0/it0", [a.peer_id, b.peer_id], torch.ones(1 << 16), 1.0, timeout=1.5)
        assert e.value.missing == [b.peer_id] and mine.resends >= 2 and len(got) >= 3
        assert trio.current_time() - t0 < 3.0  # (sending it again held the round for 3.9-6.9 s)


@pytest.mark.trio
async def test_two_rounds_of_a_split_stage_do_not_hold_each_other_open(tmp_path, monkeypatch):
    """Two members whose views of the stage differ run two rounds of one stage and iteration (other group digests):
    each sends its parts to the other every 0.3 s, and the other's parts, once its own round has run its resend
    wait, move no deadline of this one: both end at their timeout (they held each other open for good, each
    resend a payload from a member)."""
    from gwtf_node.runtime.node import allreduce
    from gwtf_node.runtime.node.allreduce import AllReducer, AllReduceTimeout

    monkeypatch.setattr(allreduce, "RESEND_MAX_S", 0.3)
    async with open_host(tmp_path / "a", dht=False) as a, open_host(tmp_path / "b", bootstrap=a.addrs, dht=False) as b:
        reducers = {h.peer_id: AllReducer(h) for h in (a, b)}
        for h in (a, b):
            async def handler(peer, env, data, r=reducers[h.peer_id]):
                _s, msg = decode(env)
                if r.accepts(msg):
                    await r.on_chunk(peer, msg, data)
            h.set_handler(handler)
            reducers[h.peer_id].resend_after_s = 0.3
        group = [a.peer_id, b.peer_id]
        ended = {}

        async def run(h, key):
            t0 = trio.current_time()
            with pytest.raises(AllReduceTimeout):
                await reducers[h.peer_id].all_reduce(key, group, torch.ones(1 << 16), 1.0, timeout=2.0)
            ended[h.peer_id] = trio.current_time() - t0

        with trio.fail_after(20.0):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, a, "s0/it0/aaaa")
                nursery.start_soon(run, b, "s0/it0/bbbb")
        assert sorted(ended) == sorted(group) and max(ended.values()) < 6.0, ended
        assert all(r.resends >= 2 for r in reducers.values())  # (each resent its parts into the other's round)


@pytest.mark.trio
async def test_a_joiner_does_not_ask_again_for_a_state_still_arriving(tmp_path, slow_records, monkeypatch):
    """A stage state of 19.7 MB at 0.3 s a MiB takes ~6 s to arrive, past the 2 s the joiner gives its source to
    answer: it is asked for once."""
    from gwtf_node.runtime.node import joining

    from support.helpers import start_source_and_joiner, until

    monkeypatch.setattr(joining, "STATE_WAIT_S", 2.0)
    with trio.fail_after(DEADLINE_S * 2):
        async with trio.open_nursery() as nursery:
            source, joiner = await start_source_and_joiner(nursery, tmp_path)
            src_id = source.parts.wire.me
            asked = []
            serve = source.parts.joining._answer_state_request

            async def counted(peer, msg):
                asked.append(msg)
                await serve(peer, msg)

            source.parts.joining._answer_state_request = counted
            t0 = trio.current_time()
            nursery.start_soon(joiner.parts.joining.fetch_state, src_id, 0)
            await until(lambda: asked and joiner.parts.joining.state_loaded.is_set(), "the state is loaded", 60)
            assert trio.current_time() - t0 > 3.0  # (slower than the 2 s given to answer)
            assert len(asked) == 1, asked
            for node in (source, joiner):
                node.stop()
