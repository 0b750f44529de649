"""The invariant across a NAT router: a swarm with relays behind a home router trains exactly as one process.

Lab (gwtf_node/testing/netlab.py): the data node d0 (the bootstrap) and the
stage-1 relay on the internet, the stage-0 relay behind a home router that
drops unsolicited inbound.  Every node listens on 0.0.0.0 (the
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
    d0, r1_0 = lab.public("d0"), lab.public("r10")
    home = lab.home("a")
    where = {"d0": d0, "r1_0": r1_0, "r0_0": home.hosts[0]}
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=ITERATIONS,
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
    print("records:", json.dumps(records))
    ref = train_centralized(man, ITERATIONS, data_nodes=1)
    assert [r["iteration"] for r in records] == list(range(ITERATIONS))
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 4
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)
    # the public nodes reach the home relay only over the connection it opened, and send it tensors there
    assert kinds["d0"]["r0_0"] == kinds["r1_0"]["r0_0"] == "inbound+libp2p", kinds
    assert kinds["r0_0"] == {"d0": "direct", "r1_0": "direct"}, kinds  # it dials out, to their tensor channels
