"""`gwtf-node local` gives each node its share of the cores (`join --torch-threads`): torch operators on
every core in each of several nodes contend for them (1.13 s against 1.29 s per iteration, 5 nodes on 2 cores)."""

from __future__ import annotations

import os
from pathlib import Path
from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local.swarm import LocalSwarm

def test_local_swarm_shares_the_cores_among_its_nodes(tmp_path: Path) -> None:
    save_manifest(default_manifest(stages=2), tmp_path / "run.json")
    for threads, want in ((None, max(1, (os.cpu_count() or 1) // 5)), (3, 3), (0, None)):
        swarm = LocalSwarm(tmp_path / str(threads), tmp_path / "run.json", data_nodes=1, stages=2, relays_per_stage=2,
                           iterations=1, torch_threads=threads, wrap={"d0": ["echo"]})
        swarm.workdir.mkdir()
        swarm._spawn("d0", None, None)  # `echo` writes the join command line to the node's log
        swarm.procs["d0"].wait(timeout=30)
        args = (swarm.state_dir("d0") / "node.log").read_text().split()
        if want is None:
            assert "--torch-threads" not in args
        else:
            assert args[args.index("--torch-threads") + 1] == str(want)


def test_local_and_join_take_torch_threads(capsys) -> None:
    from gwtf_node.cli import build_parser

    p = build_parser()
    assert p.parse_args(["local"]).torch_threads is None  # shared among the nodes
    assert p.parse_args(["local", "--torch-threads", "2"]).torch_threads == 2
    from gwtf_node import cli

    for cmd in (["local"], ["join", "--run", "r.json", "--role", "relay"]):
        assert cli.main([*cmd, "--torch-threads", "-1"]) == 2
        assert "--torch-threads" in capsys.readouterr().err
