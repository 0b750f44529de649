"""`gwtf-node local` spreads the bootstrap of a large swarm: from the `BOOTSTRAP_SPREAD_FROM`-th node on, each
node also gets two relays already listening, those it works with first, so that the first data node is not the only one
answering a hundred Hellos (a 106-node swarm's relay gave up after 300 s without its answer; a 100-node swarm's
relay of the last stage without d0's and d1's, the two data nodes it had been given beside d0), and a node of a
stage far from its own does not ignore the Hello.  A node is started once the node started `START_AHEAD` before it was
accepted: a hundred nodes dialling at once left some unanswered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local.swarm import BOOTSTRAP_SPREAD_FROM, START_AHEAD, LocalError, LocalSwarm, _near


def test_the_nodes_started_later_get_listening_relays_they_work_with_beside_d0(tmp_path: Path) -> None:
    save_manifest(default_manifest(stages=8), tmp_path / "run.json")
    swarm = LocalSwarm(tmp_path / "w", tmp_path / "run.json", data_nodes=2, stages=8, relays_per_stage=6,
                       iterations=1, wrap={"r7_5": ["echo"]})
    names = swarm.names()
    for name in names[1:45]:  # the first 44 after d0 listen; the others have not written their address yet
        swarm.state_dir(name).mkdir(parents=True)
        (swarm.state_dir(name) / "addr").write_text(f"/ip4/127.0.0.1/tcp/{1000 + names.index(name)}/p2p/{name}\n")
    d0 = "/ip4/127.0.0.1/tcp/1/p2p/d0"
    assert swarm._bootstrap(BOOTSTRAP_SPREAD_FROM - 1, d0) == [d0]
    got = swarm._bootstrap(45, d0)
    assert names[45] == "r7_1"  # (2 data nodes, then 6 relays a stage; d1 is no relay)
    assert len(got) == 3 and got[0] == d0
    assert len(set(got)) == 3 and {a.split("/p2p/")[1] for a in got[1:]} <= {f"r6_{j}" for j in range(6)} | {"r7_0"}
    assert swarm._bootstrap(45, d0) == got  # the same for the same node
    swarm.workdir.mkdir(exist_ok=True)
    swarm._spawn("r7_5", got, None)  # `echo` writes its command line
    swarm.procs["r7_5"].wait(timeout=30)
    args = (swarm.state_dir("r7_5") / "node.log").read_text().split()
    assert [args[i + 1] for i, a in enumerate(args) if a == "--bootstrap"] == got
    for name in names[38:45]:  # one relay near r7_1 listens
        if name != "r6_0":
            (swarm.state_dir(name) / "addr").unlink()
    got = swarm._bootstrap(45, d0)  # and another listening relay, which refers it to those it works with
    assert got[:2] == [d0, "/ip4/127.0.0.1/tcp/1038/p2p/r6_0"] and len(got) == 3
    assert got[2].split("/p2p/")[1] in {f"r{k}_{j}" for k in range(6) for j in range(6)}
    for name in names[1:45]:  # no near relay listens: two others
        (swarm.state_dir(name) / "addr").unlink(missing_ok=True)
    (swarm.state_dir("r0_0") / "addr").write_text("/ip4/127.0.0.1/tcp/1002/p2p/r0_0\n")
    assert swarm._bootstrap(45, d0) == [d0, "/ip4/127.0.0.1/tcp/1002/p2p/r0_0"]
    swarm.netns = {"d0": "ns0"}
    assert swarm._bootstrap(45, d0) == [d0]  # a network lab: the homes' addresses are not dialled


def test_near_is_who_works_with_whom():
    assert _near("r3_0", "d1") and _near("d0", "r5_2") and _near("d0", "d1")
    assert _near("r3_0", "r2_4") and _near("r3_0", "r3_1") and _near("r3_0", "r4_0")
    assert not _near("r3_0", "r1_0") and not _near("r3_0", "r5_0")
    assert _near("j0", "d0") and not _near("j0", "r0_0")  # a relay with --stage auto: placed later


def test_a_node_is_started_once_the_one_started_twelve_before_was_accepted(tmp_path: Path) -> None:
    save_manifest(default_manifest(stages=8), tmp_path / "run.json")
    swarm = LocalSwarm(tmp_path / "w", tmp_path / "run.json", data_nodes=2, stages=8, relays_per_stage=6,
                       iterations=1, startup_timeout_s=0.5)
    status = swarm.state_dir("r0_3") / "status.json"
    status.parent.mkdir(parents=True)
    for boot in ({"state": "retrying"}, {}):
        status.write_text(json.dumps({"bootstrap": boot}))
        with pytest.raises(LocalError, match="r0_3 was not accepted by any peer within 0 s"):
            swarm._wait_accepted("r0_3")
    for boot in ({"state": "connected"}, None):  # (None: a node with no bootstrap address, d0)
        status.write_text(json.dumps({"bootstrap": boot}))
        swarm._wait_accepted("r0_3")
    assert START_AHEAD >= BOOTSTRAP_SPREAD_FROM  # (a small swarm starts at once)
