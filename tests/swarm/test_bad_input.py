"""Bad input over real streams: a hostile peer cannot stop a training swarm.

A local swarm trains (1 data node, 2 stages x 1 relay, separate processes);
an attacker host in the test process dials the stage-0 relay and sends:
garbage bytes, an oversized length prefix, an envelope with an unknown
message type, and Forwards whose tensor has the wrong shape, the wrong dtype
or NaN values, and an envelope that names another peer as its sender.  Each must be refused and logged by the relay, and the swarm
must go on training (more iterations complete after the attack).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.tensors import pack
from gwtf_node.protocol import codec
from gwtf_node.protocol import gwtf_pb2 as pb
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net.frames import HEADER
from gwtf_node.runtime.net.host import CTRL_PROTOCOL_ID, open_host
from gwtf_node.runtime.local.swarm import LocalSwarm

from support.swarmutil import log_text, wait_for, wait_records

pytestmark = [pytest.mark.slow, pytest.mark.trio]


async def test_hostile_peer_is_refused_and_training_goes_on(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=100000)
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 2, 180)
        target_addr = (tmp_path / "r0_0" / "addr").read_text().split()[0]

        def refused_values() -> dict[str, int]:  # the relay's refusals per value-bounds code (status.json)
            return json.loads((tmp_path / "r0_0" / "status.json").read_text()).get("refused_values", {})
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
            unknown = pb.Envelope(version=codec.PROTOCOL_VERSION, sender=evil.peer_id).SerializeToString() + b"\xfa\x06\x02hi"
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
            await evil.send(target, codec.encode(d0, m.LinkCost(1.0)))  # an envelope naming another sender
            await evil.send(target, codec.encode(evil.peer_id, m.LinkCost(float("inf"))))
            await evil.send(target, codec.encode(evil.peer_id, m.LinkCost(-1.0)))
            await wait_for(lambda: {"cost_out_of_range", "negative_cost"} <= set(refused_values()), 30,
                           "the relay refused the last frame")

        after = len(swarm.records())
        await wait_records(swarm, after + 3, 120)  # training goes on
        log = (tmp_path / "r0_0" / "node.log").read_text()
        refusals = [line for line in log.splitlines() if "refused" in line]
        text = "\n".join(refusals)
        assert "envelope length" in text or "exceeds" in text, text  # garbage / oversized prefix
        assert "not a gwtf.v1.Envelope" in text, text  # well framed, not protobuf
        assert "no message body" in text, text
        assert "tensor refused" in text and "NaN" in text, text  # the tensor checks after the value bounds
        assert "Lend is from one data node to another" in text, text
        assert "envelope claims sender" in text, text
        codes = refused_values()  # wrong shape, wrong dtype, an infinite and a negative link cost
        assert {"tensor_shape", "tensor_dtype", "cost_out_of_range", "negative_cost"} <= set(codes), codes
        swarm._check_alive()
    finally:
        await trio.to_thread.run_sync(swarm.stop)
