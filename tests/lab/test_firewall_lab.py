"""A public node behind a firewall finds out by dial-back, reserves a relay slot, and the swarm trains as one process.

Lab (gwtf_node/testing/netlab.py): d0 (the bootstrap, and a circuit relay:
`--relay-service`) and the stage-0 relay on the internet; the stage-1 relay
has a public address too, but a firewall in its namespace drops every new
inbound connection (nftables).  Nothing in its addresses says so: it asks d0
to dial it back (dialback.py), learns that nobody outside reaches it,
reserves a slot on d0 and advertises only its relayed address (relay.py).
It reaches the others over the connections it opens itself (its tensors
over libp2p: nobody can dial its tensor channel); every iteration's loss
equals the centralized reference within 1e-4 relative, and the status says
`firewalled`, with its relay.
"""

from __future__ import annotations

from pathlib import Path

from support import labutil
import pytest
from support.swarmutil import log_digest, status

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized

pytestmark = [pytest.mark.netlab, pytest.mark.multiprocess, pytest.mark.slow]
lab = labutil.lab  # the fixture

ITERATIONS = 3


def test_a_firewalled_public_node_is_reached_through_a_relay(lab, tmp_path: Path) -> None:
    man = default_manifest(family="llama", stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    names = ["d0", "r0_0", "r1_0"]
    swarm, where = labutil.public_swarm(lab, tmp_path, run, names, data_nodes=1, stages=2, relays_per_stage=1,
                                        iterations=ITERATIONS, extra={"d0": ["--relay-service"]})
    lab.firewall(where["r1_0"])
    records, seen, relays, addrs = [], {}, set(), set()
    try:
        swarm.start()
        for rec in swarm.iterations_done():
            records.append(rec)
            for name in names:
                st = status(tmp_path, name)
                seen.setdefault(name, set()).add(st.get("reachability", {}).get("kind"))
                if name == "r1_0":
                    relays.update(st.get("reachability", {}).get("relays", []))
                    addrs = set(st.get("addrs", [])) or addrs  # (the last ones it advertised)
    finally:
        swarm.stop()
    print("seen:", seen, "relays", relays, "addrs", addrs)
    ref = train_centralized(man, ITERATIONS, data_nodes=1)
    assert [r["iteration"] for r in records] == list(range(ITERATIONS))
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 4, (rec, log_digest(tmp_path, where))
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)
    assert "firewalled" in seen["r1_0"] and "public" in seen["r0_0"], seen
    assert "public" in seen["d0"], seen  # the bootstrap, which dials nobody, asks a peer that greeted it
    d0_id = status(tmp_path, "d0")["peer_id"]
    assert relays == {d0_id}, relays
    assert addrs and all(f"/p2p/{d0_id}/p2p-circuit/" in a for a in addrs), addrs
