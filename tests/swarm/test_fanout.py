"""Bounded fan-out: a relay connects to its own and the neighbouring stages and to the data nodes, no more.

The rule (protocol/fanout.py) on hand-checked swarms, and a local swarm of
one data node and 4 stages x 1 relay plus a joiner (`--stage auto`), which
meets one relay of each stage (its sample) before it is placed: once it is,
each relay knows only the data node and the relays of its own and the
neighbouring stages (status.json `peers`; the joiner and the relays of its
sample let go of each other), the data node knows everyone, and every iteration's
loss equals the centralized reference (the flows, the aggregation and the
placement of the joiner need nothing beyond those connections).

The joiner is also the volunteer who joins a run in flight: placed by the
leader after its first iteration, it loads its stage's weights and optimizer
state from the stage's relay, takes part from the next iteration boundary
on, and once the data node stopped it has stepped with its stage peer to the
end, its parameters equal to the peer's bit for bit.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.protocol import fanout
from gwtf_node.runtime.local.swarm import LocalSwarm
from support.swarmutil import fresh_statuses, log_digest, status

MAX_ITERATIONS = 1000  # the run is stopped once the joiner serves and 3 more iterations settled
JOIN_WITHIN_S = 150.0


def test_works_with() -> None:
    assert fanout.works_with("relay", 2, "relay", 1) and fanout.works_with("relay", 2, "relay", 3)
    assert fanout.works_with("relay", 2, "relay", 2)
    assert not fanout.works_with("relay", 2, "relay", 0) and not fanout.works_with("relay", 0, "relay", 4)
    assert fanout.works_with("relay", 5, "data", -1) and fanout.works_with("data", -1, "relay", 5)
    assert not fanout.works_with("relay", fanout.UNPLACED, "relay", 0)  # (its sample: wants_sample)
    assert fanout.wants_sample("relay", fanout.UNPLACED, "relay", 3, known_in_stage=1)
    assert not fanout.wants_sample("relay", fanout.UNPLACED, "relay", 3, known_in_stage=fanout.SAMPLE_PER_STAGE)
    assert not fanout.wants_sample("relay", 1, "relay", 3, known_in_stage=0)


def test_provider_keys() -> None:
    assert fanout.provider_keys("r", "data", -1, 4) == ["run/r"]
    assert fanout.provider_keys("r", "relay", 0, 4) == ["run/r/data", "run/r/stage/0", "run/r/stage/1"]
    assert fanout.provider_keys("r", "relay", 2, 4) == ["run/r/data"] + [f"run/r/stage/{k}" for k in (1, 2, 3)]
    assert fanout.provider_keys("r", "relay", -2, 3) == ["run/r/data"] + [f"run/r/stage/{k}" for k in range(3)]
    assert fanout.provided_keys("r", "data", -1) == ["run/r", "run/r/data"]
    assert fanout.provided_keys("r", "relay", 3) == ["run/r", "run/r/stage/3"]
    assert fanout.provided_keys("r", "relay", -2) == ["run/r"]


def test_degrees_by_hand() -> None:
    # d, then stages 0..3 with 2 relays each, and one unplaced relay u
    nodes = [("d", "data", -1)] + [(f"r{s}{i}", "relay", s) for s in range(4) for i in range(2)] + [("u", "relay", -2)]
    deg = fanout.degrees(nodes)
    assert deg["d"] == 9  # everyone
    assert deg["r00"] == 1 + 1 + 2 + 1  # d, its stage-mate, stage 1, u's sample (the lowest ids of each stage)
    assert deg["r01"] == 1 + 1 + 2 + 1
    assert deg["r10"] == 1 + 1 + 2 + 2 + 1  # d, stage-mate, stages 0 and 2, u
    assert deg["r31"] == 1 + 1 + 2 + 1
    assert deg["u"] == 1 + 2 * 4  # d and 2 of each stage
    assert fanout.full_mesh_degrees([n[0] for n in nodes])["r00"] == 9


def test_degrees_grow_with_three_stages_not_the_swarm() -> None:
    def swarm(per_stage: int, stages: int = 6, data: int = 3):
        return [(f"d{i}", "data", -1) for i in range(data)] + \
            [(f"r{s}_{i}", "relay", s) for s in range(stages) for i in range(per_stage)]
    small, big = fanout.degrees(swarm(5)), fanout.degrees(swarm(20))
    relay_max = lambda deg: max(v for k, v in deg.items() if k.startswith("r"))  # noqa: E731
    assert relay_max(small) == 3 + 3 * 5 - 1 and relay_max(big) == 3 + 3 * 20 - 1
    assert max(v for k, v in big.items() if k.startswith("d")) == 3 + 6 * 20 - 1


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_four_stage_swarm_connects_only_what_works_together(tmp_path: Path) -> None:
    man = default_manifest(stages=4, seq_len=16, microbatch_size=2, microbatches_per_iteration=2)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=4, relays_per_stage=1, iterations=MAX_ITERATIONS,
                       startup_timeout_s=120, iteration_timeout_s=120)
    names = ["d0"] + [f"r{s}_0" for s in range(4)]
    records: list[dict] = []
    placed_at = None
    try:
        swarm.start()
        started = time.monotonic()
        for rec in swarm.iterations_done():
            records.append(rec)
            if len(records) == 1:
                swarm.add_relay("j0", auto=True)  # placed by the leader: first its sample, then its stage
            elif placed_at is None:
                st = status(tmp_path, "j0") if (tmp_path / "j0" / "status.json").exists() else {}
                if st.get("stage") is not None and st["stage"] >= 0 and not st.get("joining"):
                    placed_at = len(records)
                assert time.monotonic() - started < JOIN_WITHIN_S, ("j0 not serving", log_digest(tmp_path, names))
            elif len(records) >= placed_at + 3:
                break
        statuses = fresh_statuses(tmp_path, names + ["j0"], 30)
        # stop the data node first: no new iteration opens, the aggregation in flight completes
        swarm.procs["d0"].terminate()
        swarm.procs["d0"].wait(timeout=60)
        peer = f"r{statuses['j0']['stage']}_0"
        deadline = time.monotonic() + 60
        while status(tmp_path, "j0").get("steps_applied") != status(tmp_path, peer).get("steps_applied"):
            assert time.monotonic() < deadline, ("j0 does not step with its stage peer", status(tmp_path, "j0"),
                                                 status(tmp_path, peer))
            time.sleep(0.2)
    finally:
        swarm.stop()
    print("records", json.dumps(records))
    ref = train_centralized(man, len(records), data_nodes=1)
    assert [r["iteration"] for r in records] == list(range(len(records)))
    for rec, loss in zip(records, ref.losses):
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss, log_digest(tmp_path, names))
    known = {n: {p["name"] for p in st["peers"].values()} for n, st in statuses.items()}
    stage_of = {n: st["stage"] for n, st in statuses.items()}
    print("known", {n: sorted(k) for n, k in known.items()}, "stages", stage_of)
    assert known["d0"] == set(names[1:]) | {"j0"}, known["d0"]
    relays = names[1:] + ["j0"]
    for n in relays:
        want = {"d0"} | {r for r in relays if r != n and abs(stage_of[r] - stage_of[n]) <= 1}
        assert known[n] == want, (n, known[n], want)  # (j0 let go of its sample once placed, and they of it)
    # a relay two stages away from r0_0 is not known to it, nor it to them
    assert "r2_0" not in known["r0_0"] and "r3_0" not in known["r0_0"] and "r0_0" not in known["r3_0"]

    # the joiner took its stage's state from its peer mid-run and stepped with it to the end
    log = (tmp_path / "j0" / "node.log").read_text()
    assert "assigned to stage" in log and "state loaded from" in log, log[-2000:]
    joined_at = int(log.split("taking part from iteration ")[-1].split()[0])
    assert joined_at >= 1  # (it was started once the first iteration was recorded)
    new = torch.load(tmp_path / "j0" / "checkpoint.pt", weights_only=False)
    mate = torch.load(tmp_path / peer / "checkpoint.pt", weights_only=False)
    assert new["stage"] == mate["stage"] == statuses["j0"]["stage"]
    assert new["steps"] == mate["steps"] > joined_at  # it stepped with its stage to the end
    assert torch.equal(new["params"], mate["params"])  # bit for bit: same state, same all-reduced update
