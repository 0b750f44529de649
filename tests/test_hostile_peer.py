"""Hostile peers attack a training swarm; every attempt is refused and the run trains on.

One swarm (1 data node, 2 stages x 1 relay, separate processes) takes two
attacks in turn, each checked by its own test:

Value attacks.  A hostile host in the test process, written with the
project's own codec, joins: it says Hello as a relay of stage 0 that is still
fetching its state (so it is a member nobody routes to yet), answers Pings so
that it stays a member, and sends, in turn: a negative cost announcement, a
label epoch far ahead, a Request Flow beyond the capacity it announced (0), a
Forward of the wrong shape, of the wrong dtype and with a huge finite value,
a BEGIN AGGREGATION a billion iterations ahead, and a leader heartbeat of a
term far ahead.  Each is refused: the code is read from the target's
status.json (`refused_values`), not from log text.

Bad input over real streams.  Another hostile host dials the stage-0 relay
and sends garbage bytes, an oversized length prefix, an envelope with an
unknown message type, and Forwards whose tensor has the wrong shape, the
wrong dtype or NaN values, a Lend (a data node's message) and link costs
out of range.  Each is refused and logged by the relay.

After each attack the run trains on, and every iteration's loss so far
equals the centralized reference within 1e-4 (the manifest clips gradients,
`grad_clip_norm`, and the reference clips the same way).

(A relay poisoning its gradient in a real swarm: tests/test_poison.py.)
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.model.tensors import pack
from gwtf_node.protocol import codec
from gwtf_node.protocol import gwtf_pb2 as pb
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.frames import HEADER
from gwtf_node.runtime.host import CTRL_PROTOCOL_ID, open_host
from gwtf_node.runtime.local import LocalSwarm

from swarmutil import log_text, status, wait_for, wait_records

pytestmark = [pytest.mark.slow, pytest.mark.trio]



def _manifest(stages: int, microbatches: int):
    """A manifest whose gradients are clipped (`grad_clip_norm`; the reference clips the same way)."""
    man = default_manifest(stages=stages, seq_len=16, microbatch_size=2, microbatches_per_iteration=microbatches)
    return replace(man, train=replace(man.train, grad_clip_norm=0.5))


def _codes(workdir: Path, name: str) -> dict[str, int]:
    return status(workdir, name).get("refused_values", {})


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory):
    """The swarm both attacks hit, one after the other: 1 data node, 2 stages x 1 relay, training until stopped."""
    tmp_path = tmp_path_factory.mktemp("attacked")
    man = _manifest(2, 2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=100000)
    swarm.startup_timeout_s = swarm.iteration_timeout_s = 120
    try:
        swarm.start()
        yield SimpleNamespace(swarm=swarm, man=man, tmp_path=tmp_path)
    finally:
        swarm.stop()


async def _trains_on_as_the_reference(attacked, iterations: int) -> None:
    """`iterations` more iterations complete, and every loss so far equals the centralized reference."""
    swarm = attacked.swarm
    records = await wait_records(swarm, len(swarm.records()) + iterations, 120)
    ref = train_centralized(attacked.man, len(records))
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 2
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)
    swarm._check_alive()


async def test_value_attacks_are_refused_with_their_codes_and_training_equals_the_reference(attacked):
    swarm, man, tmp_path = attacked.swarm, attacked.man, attacked.tmp_path
    await wait_records(swarm, 1, 120)
    before = {n: _codes(tmp_path, n) for n in ("r0_0", "d0")}  # (the other attack may have come first)
    d0 = status(tmp_path, "d0")["peer_id"]
    shape = (man.data.microbatch_size, man.data.seq_len, man.dims.hidden)

    async with open_host(tmp_path / "hostile", dht=False) as evil:
        async def answer_pings(peer: str, envelope: bytes, payload) -> None:
            _sender, msg = codec.decode(envelope)
            if isinstance(msg, m.Ping):
                await evil.send(peer, codec.encode(evil.peer_id, m.Pong(msg.nonce)))

        evil.set_handler(answer_pings)
        relay = await evil.connect((tmp_path / "r0_0" / "addr").read_text().split()[0])
        data = await evil.connect((tmp_path / "d0" / "addr").read_text().split()[0])
        cert = swarm.admit(tmp_path / "hostile", "relay").read_bytes()  # an admitted member turned hostile
        hello = m.Hello(swarm.run_id, "relay", 0, "hostile", 0, tuple(evil.addrs), joining=True,
                        certificate=cert)
        for peer in (relay, data):
            await evil.send(peer, codec.encode(evil.peer_id, hello))
        await wait_for(lambda: evil.peer_id in status(tmp_path, "r0_0").get("peers", {}), 30,
                       "the relay knows the hostile member")

        async def send(peer: str, msg, payload=b"") -> None:
            await evil.send(peer, codec.encode(evil.peer_id, msg), payload)

        async def forward(t: torch.Tensor) -> None:
            header, payload = pack(t)
            it = len(swarm.records())
            await send(relay, m.Forward(d0, 10**6, it, (d0,), header), payload)

        huge = torch.zeros(shape)
        huge[0, 0, 0] = 1e9
        attacks = [  # (target, code, attempt)
            ("r0_0", "negative_cost", send(relay, m.CostAnnounce((m.Label(d0, m.Side.IN, -1e3, ()),)))),
            ("r0_0", "epoch_jump", send(relay, m.CostAnnounce((m.Label(d0, m.Side.IN, 5.0, (), 2**31),)))),
            ("r0_0", "over_capacity", send(relay, m.RequestFlow(1, d0, 5.0))),
            ("r0_0", "tensor_shape", forward(torch.zeros(shape[0], shape[1] + 1, shape[2]))),
            ("r0_0", "tensor_dtype", forward(torch.zeros(shape, dtype=torch.float64))),
            ("r0_0", "tensor_magnitude", forward(huge)),
            ("r0_0", "iteration_far", send(relay, m.BeginAggregation(10**9, 1))),
            ("d0", "term_jump", send(data, m.LeaderHeartbeat(2**40, 0.0, (evil.peer_id,)))),
        ]
        for _target, _code, attempt in attacks:  # one after the other, while the swarm trains
            await attempt
        swarm._check_alive()

        def missing() -> list[str]:
            return [f"{t}:{c}" for t, c, _ in attacks if _codes(tmp_path, t).get(c, 0) <= before[t].get(c, 0)]

        await wait_for(lambda: not missing(), 30, "every attack refused with its code", swarm)

    await _trains_on_as_the_reference(attacked, 3)

async def test_bad_input_is_refused_and_training_goes_on(attacked) -> None:
    swarm, man, tmp_path = attacked.swarm, attacked.man, attacked.tmp_path
    await wait_records(swarm, 2, 120)
    target_addr = (tmp_path / "r0_0" / "addr").read_text().split()[0]
    before = _codes(tmp_path, "r0_0")  # (the other attack may have come first: refusals counted from here)
    log_from = len(log_text(tmp_path, "r0_0"))

    def refused_values() -> dict[str, int]:  # the relay's new refusals per value-bounds code (status.json)
        return {c: k - before.get(c, 0) for c, k in _codes(tmp_path, "r0_0").items() if k > before.get(c, 0)}
    d0 = json.loads((tmp_path / "d0" / "status.json").read_text())["peer_id"]
    shape = (man.data.microbatch_size, man.data.seq_len, man.dims.hidden)

    cert = swarm.admit(tmp_path / "attacker", "data").read_bytes()  # a member, so that its frames are read
    async with open_host(tmp_path / "attacker", dht=False) as evil:
        target = await evil.connect(target_addr)
        from libp2p.peer.id import ID

        async def raw(data: bytes) -> None:
            stream = await evil.libp2p.new_stream(ID.from_base58(target), [CTRL_PROTOCOL_ID])
            try:
                await stream.write(data)
                with trio.move_on_after(1):
                    await stream.read(1)  # the node resets the stream, or keeps it open
            except Exception:  # noqa: BLE001 - a reset or EOF is the expected answer
                pass
            finally:
                with trio.move_on_after(1):
                    try:
                        await stream.reset()
                    except Exception:  # noqa: BLE001
                        pass

        await raw(os.urandom(4096))  # garbage: header lengths out of bounds
        await raw(HEADER.pack(1 << 31, 0))  # oversized length prefix
        junk = b"\x0a\xff\xff\xff\xff\x0f"  # a well-framed envelope that is not one (truncated field)
        await raw(HEADER.pack(len(junk), 0) + junk)
        unknown = pb.Envelope(version=1, sender=evil.peer_id).SerializeToString() + b"\xfa\x06\x02hi"
        await evil.send(target, unknown)  # an unknown message type (a field this node does not know)
        await evil.send(target, codec.encode(evil.peer_id, m.Hello(swarm.run_id, "data", -1, "evil", 1, (),
                                                             certificate=cert)))

        async def forward(seq: int, t: torch.Tensor) -> None:
            header, payload = pack(t)
            await evil.send(target, codec.encode(evil.peer_id, m.Forward(d0, 10**6 + seq, 0, (d0,), header)),
                            payload)

        await forward(1, torch.zeros(shape[0], shape[1] + 1, shape[2]))  # wrong shape
        await forward(2, torch.zeros(shape, dtype=torch.float64))  # wrong dtype
        bad = torch.zeros(shape)
        bad[0, 0, 0] = float("nan")
        await forward(3, bad)  # NaN
        await evil.send(target, codec.encode(evil.peer_id, m.Lend(0, target)))  # a data node's message, to a relay
        await evil.send(target, codec.encode(evil.peer_id, m.LinkCost(float("inf"))))
        await evil.send(target, codec.encode(evil.peer_id, m.LinkCost(-1.0)))
        await wait_for(lambda: {"cost_out_of_range", "negative_cost"} <= set(refused_values()), 30,
                       "the relay refused the last frame")

    await _trains_on_as_the_reference(attacked, 3)  # training goes on
    log = log_text(tmp_path, "r0_0")[log_from:]
    refusals = [line for line in log.splitlines() if "refused" in line]
    text = "\n".join(refusals)
    assert "envelope length" in text or "exceeds" in text, text  # garbage / oversized prefix
    assert "not a gwtf.v1.Envelope" in text, text  # well framed, not protobuf
    assert "no message body" in text, text
    assert "tensor refused" in text and "NaN" in text, text  # the tensor checks after the value bounds
    assert "Lend is from one data node to another" in text, text
    codes = refused_values()  # wrong shape, wrong dtype, an infinite and a negative link cost
    assert {"tensor_shape", "tensor_dtype", "cost_out_of_range", "negative_cost"} <= set(codes), codes
