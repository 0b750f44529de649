"""The invariant across a NAT router: a swarm with relays behind a home router trains exactly as one process.

Lab (gwtf_node/testing/netlab.py): the data node d0 (the bootstrap) and one
relay of each stage on the internet; one relay of each stage behind a home
router that drops unsolicited inbound.  Every node listens on 0.0.0.0 (the
daemon advertises its interface address).  The home relays dial out; public
nodes reach them only over those connections, their activations and
gradients over libp2p instead of the tensor channel.  Every iteration's
loss equals the centralized reference within 1e-4 relative, as on loopback
(tests/test_swarm.py), and the status says how each neighbour is reached.
"""

from __future__ import annotations

import json
from pathlib import Path

import labutil
import pytest

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.local import LocalSwarm

pytestmark = [pytest.mark.netlab, pytest.mark.multiprocess, pytest.mark.slow]
lab = labutil.lab  # the fixture

ITERATIONS = 3


def test_swarm_behind_a_nat_router_equals_centralized(lab, tmp_path: Path) -> None:
    man = default_manifest(family="llama", stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    d0, r0_1, r1_1 = lab.public("d0"), lab.public("r01"), lab.public("r11")
    home = lab.home("a", hosts=2)
    where = {"d0": d0, "r0_1": r0_1, "r1_1": r1_1, "r0_0": home.hosts[0], "r1_0": home.hosts[1]}
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=2, iterations=ITERATIONS,
                       wrap={name: ["ip", "netns", "exec", node.ns] for name, node in where.items()},
                       extra_args={name: ["--listen", "0.0.0.0:4001"] for name in where})
    swarm.startup_timeout_s = 90
    swarm.iteration_timeout_s = 90
    records, kinds = [], {}
    try:
        swarm.start()
        assert (tmp_path / "d0" / "addr").read_text().split()[0].startswith(f"/ip4/{d0.ip}/tcp/4001/p2p/")
        for rec in swarm.iterations_done():
            records.append(rec)
        for name in swarm.names():  # while the swarm still runs: how each node reaches its peers
            st = json.loads((tmp_path / name / "status.json").read_text())
            kinds[name] = {p["name"]: p["connection"] for p in st["peers"].values()}
    finally:
        swarm.stop()
    print("connections:", json.dumps(kinds, sort_keys=True))
    ref = train_centralized(man, ITERATIONS, data_nodes=1)
    assert [r["iteration"] for r in records] == list(range(ITERATIONS))
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 4
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)
    # a public node reaches a home relay only over the connection the relay opened
    for pub in ("d0", "r0_1", "r1_1"):
        for home_relay in ("r0_0", "r1_0"):
            assert kinds[pub].get(home_relay, "none").startswith(("inbound", "none")), (pub, kinds[pub])
    assert any(k.endswith("+libp2p") for v in kinds.values() for k in v.values()), kinds
