"""The invariant across NAT routers: a swarm whose relays sit behind two home routers trains as one process.

Lab (gwtf_node/testing/netlab.py): the data node d0 (the bootstrap, and a
circuit relay: `--relay-service`) on the internet; the stage-0 relay behind
one home router, the stage-1 relay behind another, both routers dropping
unsolicited inbound.  Every node listens on 0.0.0.0 (the daemon advertises
its interface address).  The home relays dial d0; d0 reaches them over
those connections; they reserve a slot on d0 and reach each other through
it (relay.py), their activations and gradients over libp2p instead of the
tensor channel, until DCUtR replaces the relayed connection by a direct one
(holepunch.py; either is accepted here, tests/lab/test_holepunch_lab.py checks
the upgrade).  Every iteration's loss equals the centralized reference
within 1e-4 relative, as on loopback (tests/swarm/test_swarm.py), and the status
says how each neighbour is reached.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from support import labutil
import pytest
from support.swarmutil import log_digest, status

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.local.swarm import LocalSwarm

pytestmark = [pytest.mark.netlab, pytest.mark.multiprocess, pytest.mark.slow]
lab = labutil.lab  # the fixture

ITERATIONS = 3
# d0 reaches the home relays only over the connections they opened, and sends them tensors there; the two homes
# reach each other through d0's relay, until a hole punch replaces it (tests/lab/test_holepunch_lab.py): either kind
HOMES = ("relayed+libp2p", "hole-punched+libp2p")
WANT = {"d0": {"r0_0": ("inbound+libp2p",), "r1_0": ("inbound+libp2p",)},
        "r0_0": {"d0": ("direct",), "r1_0": HOMES},
        "r1_0": {"d0": ("direct",), "r0_0": HOMES}}


def test_swarm_behind_a_nat_router_equals_centralized(lab, tmp_path: Path) -> None:
    man = default_manifest(family="llama", stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    d0, a, b = lab.public("d0"), lab.home("a"), lab.home("b")
    where = {"d0": d0, "r0_0": a.hosts[0], "r1_0": b.hosts[0]}
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=ITERATIONS,
                       netns={name: node.ns for name, node in where.items()},
                       extra_args={name: ["--listen", "0.0.0.0:4001", *(["--relay-service"] if name == "d0" else [])]
                                   for name in where})
    swarm.startup_timeout_s = 90
    swarm.iteration_timeout_s = 90
    records, kinds = [], {}
    try:
        swarm.start()
        assert (tmp_path / "d0" / "addr").read_text().split()[0].startswith(f"/ip4/{d0.ip}/tcp/4001/p2p/")
        def look() -> bool:  # how each node reaches its peers, from its status.json (rewritten once a second; a
            for name in swarm.names():  # peer that left is not listed): every kind seen is kept
                for p in status(tmp_path, name).get("peers", {}).values():
                    kinds.setdefault(name, {}).setdefault(p["name"], set()).add(p["connection"])
            return all(set(k) & kinds.get(n, {}).get(p, set()) for n, peers in WANT.items() for p, k in peers.items())

        for rec in swarm.iterations_done():
            records.append(rec)
            look()
        deadline = time.monotonic() + 10  # (a run of three short iterations can end before a status is rewritten)
        while not look() and time.monotonic() < deadline:
            time.sleep(0.25)
    finally:
        swarm.stop()
    print("connections:", {n: {p: sorted(v) for p, v in k.items()} for n, k in kinds.items()})
    print("records:", json.dumps(records))
    ref = train_centralized(man, ITERATIONS, data_nodes=1)
    assert [r["iteration"] for r in records] == list(range(ITERATIONS))
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 4, (rec, log_digest(tmp_path, where))
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)
    for name, peers in WANT.items():  # each kind seen while the swarm ran (a payload path expires when idle)
        assert set(kinds[name]) == set(peers) and all(set(k) & kinds[name][p] for p, k in peers.items()), kinds
