"""A hostile member tries each value attack on a training swarm; every attempt is refused with its code.

Both swarms run in the test's process (tests/support/inproc.py: the daemons as
`Node.run` tasks over real libp2p on loopback): what is checked is what a
node decides about the frames it receives, which needs no process of its own.

Value attacks (1 data node, 2 stages x 1 relay).  A hostile host, written
with the project's own codec, joins: it says Hello as a relay of stage 0
that is still fetching its state (so it is a member nobody routes to yet),
answers Pings so that it stays a member, and sends, in turn: a negative cost
announcement, a label epoch far ahead, a Request Flow beyond the capacity it
announced (0), a Forward of the wrong shape, of the wrong dtype and with a
huge finite value, a BEGIN AGGREGATION a billion iterations ahead, and a
leader heartbeat of a term far ahead.  Each is refused: the code is read
from the target's value counts (status.json `refused_values`), not from log
text.  The run trains on: every iteration's loss equals the centralized
reference within 1e-4 (the manifest clips gradients, `grad_clip_norm`, and
the reference clips the same way).

Gradient poisoning (1 data node, 1 stage x 2 relays).  One relay's gradient
is scaled by 1e6 before every all-reduce from iteration 3 on (fault
injection, runtime/node/faults.py; if the flows give it no microbatch, it sends a
made-up gradient all the same).  The part owners refuse the poisoned
contribution (protocol/gradguard.py), both relays count it
(`gradient_outlier`), the contributions it carried count as lost, and the
run stays finite.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.model.tensors import pack
from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net.host import open_host

from support.helpers import until
from support.inproc import in_process_swarm

pytestmark = [pytest.mark.slow, pytest.mark.trio]

ITERATIONS = 6
ATTACK_ITERATIONS = 16  # enough that the attacks (a second or two) land while the swarm still trains
POISON_FROM = 3
DEADLINE_S = 300


def _manifest(stages: int, microbatches: int):
    man = default_manifest(stages=stages, seq_len=16, microbatch_size=2, microbatches_per_iteration=microbatches)
    return replace(man, train=replace(man.train, grad_clip_norm=0.5))


async def test_value_attacks_are_refused_with_their_codes_and_training_equals_the_reference(tmp_path: Path):
    man = _manifest(2, 2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    with trio.fail_after(DEADLINE_S):
        async with in_process_swarm(tmp_path, run, stages=2, relays_per_stage=1, iterations=ATTACK_ITERATIONS) as swarm:
            await swarm.start()
            await swarm.wait_records(1, 120)
            d0 = swarm.peer_id("d0")
            shape = (man.data.microbatch_size, man.data.seq_len, man.dims.hidden)

            def codes(name: str) -> dict[str, int]:
                return swarm.nodes[name].values.snapshot()

            async with open_host(tmp_path / "hostile", dht=False) as evil:
                async def answer_pings(peer: str, envelope: bytes, payload) -> None:
                    _sender, msg = codec.decode(envelope)
                    if isinstance(msg, m.Ping):
                        await evil.send(peer, codec.encode(evil.peer_id, m.Pong(msg.nonce)))

                evil.set_handler(answer_pings)
                relay = await evil.connect(swarm.addr("r0_0"))
                data = await evil.connect(swarm.addr("d0"))
                cert = swarm.admit(tmp_path / "hostile", "relay").read_bytes()  # an admitted member turned hostile
                hello = m.Hello(swarm.run_id, "relay", 0, "hostile", 0, tuple(evil.addrs), joining=True,
                                certificate=cert)
                for peer in (relay, data):
                    await evil.send(peer, codec.encode(evil.peer_id, hello))
                await until(lambda: evil.peer_id in swarm.nodes["r0_0"].peers, "the relay knows the hostile member",
                            30)

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
                assert len(swarm.records()) < ATTACK_ITERATIONS, "the attacks came after training ended"

                def missing() -> list[str]:
                    return [f"{t}:{c}" for t, c, _ in attacks if codes(t).get(c, 0) < 1]

                await until(lambda: not missing(), "every attack refused with its code", 30)

            records = await swarm.wait_records(ATTACK_ITERATIONS, 180)
    ref = train_centralized(man, ATTACK_ITERATIONS)
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 2
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)


class _Held(dict):
    """A relay's `contrib_for` (aggregation.py) that remembers how many contributions each iteration's step took."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: dict[int, int] = {}

    def pop(self, key, default=None):
        v = super().pop(key, default)
        self.taken[key] = len(v or ())
        return v


async def test_a_poisoned_gradient_is_refused_by_the_stage_and_the_run_stays_finite(tmp_path: Path):
    man = _manifest(1, 4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    (tmp_path / "r0_1").mkdir(parents=True)
    (tmp_path / "r0_1" / "poison").write_text(f"1e6@{POISON_FROM}")  # this relay's fault injection
    with trio.fail_after(DEADLINE_S):
        async with in_process_swarm(tmp_path, run, stages=1, relays_per_stage=2, iterations=ITERATIONS) as swarm:
            await swarm.start_node("d0", None)
            boot = swarm.addr("d0")
            await swarm.start_node("r0_0", boot)
            poisoner = await swarm.start_node("r0_1", boot)
            held = poisoner.parts.aggregation.contrib_for = _Held()
            records = await swarm.wait_records(ITERATIONS, 240)
            assert all(math.isfinite(r["loss"]) for r in records), records
            # the iterations in which the poisoned relay carried microbatches: those are lost (the survivors' mean)
            carried = {str(it) for it, k in held.taken.items() if it >= POISON_FROM and k > 0}
            for name in ("r0_0", "r0_1"):  # each owner of a part refused the poisoned contribution to it
                node = swarm.nodes[name]

                def counted(node=node) -> bool:
                    lost = {str(k) for k in node.parts.aggregation.lost_contributions}
                    return node.values.snapshot().get("gradient_outlier", 0) >= ITERATIONS - POISON_FROM \
                        and lost >= carried

                await until(counted, f"{name} counts the refused contributions", 15)
            honest = swarm.nodes["r0_0"].stage
            await until(lambda: honest.applied_steps >= ITERATIONS, "the honest relay applied every step", 15)
            assert honest.applied_steps == ITERATIONS
