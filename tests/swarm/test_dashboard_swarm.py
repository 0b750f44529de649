"""The dashboard of a running swarm: control sockets, the views, a terminal, Prometheus, `leave`.

One local swarm (1 data node, 2 stages x 1 relay) trains; then, in order:
each node's view read through its control socket holds the fields with the
swarm's values (roles and stages, one member per stage, the same leader and
term on every node, the iteration of the leader's records, microbatches
completed, neighbours alive); `gwtf-node status` draws frames in a real
pseudo-terminal (`--once`, and the live view stopped with Ctrl-C); the data
node's metrics endpoint is scraped and parsed; `leave` over the socket makes
the stage-1 relay leave gracefully, after which the data node's view shows
its leave and the run paused on the empty stage, and `status` of the relay
says nobody runs there and exits 1.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.ops.control import ask
from gwtf_node.runtime.local.swarm import LocalSwarm

from support.helpers import free_port
from support.ptyutil import run_in_pty
from support.swarmutil import wait_exit, wait_for, wait_records
from test_metrics import scrape, value

pytestmark = [pytest.mark.slow, pytest.mark.trio]
NODES = ("d0", "r0_0", "r1_0")


async def test_dashboard_of_a_running_swarm(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    port = free_port()
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=100000,
                       extra_args={"d0": ["--metrics-port", str(port)]})
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 1, 180)

        def views() -> dict[str, dict]:
            return {n: ask(tmp_path / n, "status")["status"] for n in NODES}

        # every node knows the leader and its term (relays hear it in the leader's utilization queries)
        await wait_for(lambda: len({(v["election"]["leader"], v["election"]["term"])
                                    for v in views().values()} - {(None, None)}) == 1
                       and all(v["election"]["leader"] for v in views().values()), 30, "one leader everywhere", swarm)
        before = len(swarm.records())  # (the swarm trains on while the views are read: they fall between these)
        v = await trio.to_thread.run_sync(views)
        done = len(swarm.records())
        d0, r0, r1 = v["d0"], v["r0_0"], v["r1_0"]
        assert (d0["node"]["role"], d0["node"]["stage"]) == ("data", None)
        assert [(x["node"]["role"], x["node"]["stage"]) for x in (r0, r1)] == [("relay", 0), ("relay", 1)]
        # a relay's capacity is its --capacity (the demand here), what it holds at once what fits this machine
        assert d0["node"]["hold_limit"] is None
        assert all(x["node"]["capacity"] == 4 and x["node"]["hold_limit"] > 100 for x in (r0, r1)), (r0, r1)
        assert d0["election"]["leader"] == d0["node"]["peer_id"] and d0["node"]["is_leader"]
        assert d0["election"]["voters"] == [{"peer_id": d0["node"]["peer_id"], "name": "d0", "reachable": True,
                                             "me": True}]
        assert {x["election"]["term"] for x in v.values()} == {d0["election"]["term"]} and d0["election"]["term"] >= 1
        for x in v.values():
            assert x["node"]["state"] in ("training", "aggregating")
            assert [len(s["members"]) for s in x["stages"]] == [1, 1]
            assert before - 1 <= x["iteration"]["number"] <= done + 2  # the iteration in flight, per the records
            assert all(nb["alive"] and nb["connection"] in ("direct", "inbound") and nb["rtt_ms"] > 0 for nb in x["neighbours"])
            names = [m["name"] for s in x["stages"] for m in s["members"]] + [e["text"] for e in x["events"]] + \
                [f["peer_name"] for f in x["flows"]] + [f["data_node_name"] for f in x["flows"]]
            assert names and not [t for t in names if "12D3KooW" in t]
        assert [s["utilization"] for s in d0["stages"]] == [1.0, 1.0]  # the leader's utilization round
        assert d0["microbatches"]["completed"] >= 4 * (before - 1) and d0["microbatches"]["lost"] == 0
        assert d0["loss"]["this_node"] is not None and d0["loss"]["run"] is not None
        assert {nb["name"] for nb in d0["neighbours"]} == {"r0_0", "r1_0"}
        assert any(e["kind"] == "join" and e["text"].startswith("r0_0") for e in d0["events"])
        for n in NODES:
            sock = tmp_path / n / "control.sock"
            assert stat.S_IMODE(sock.stat().st_mode) == 0o600

        # the dashboard in a real terminal: one frame, then the live view until Ctrl-C
        rc, frame = await trio.to_thread.run_sync(lambda: run_in_pty(["status", "--state-dir", str(tmp_path),
                                                                      "--once"]))
        assert rc == 0, frame
        assert "\x1b[" in frame and all(n in frame for n in NODES) and "election" in frame
        rc, live = await trio.to_thread.run_sync(lambda: run_in_pty(
            ["status", "--state-dir", str(tmp_path / "d0"), "--interval", "0.5"],
            interrupt_when=lambda drawn: drawn.count("recent events") >= 3))
        assert rc == 0 and live.count("recent events") >= 3, live[-2000:]  # drawn, then redrawn until Ctrl-C

        # Prometheus
        fam = await trio.to_thread.run_sync(scrape, port)
        assert value(fam, "gwtf_leader_term") == d0["election"]["term"]
        assert value(fam, "gwtf_iteration") >= d0["iteration"]["number"]
        assert value(fam, "gwtf_microbatches_completed_total") >= d0["microbatches"]["completed"]
        assert value(fam, "gwtf_link_latency_seconds", peer="r0_0") > 0

        # leave over the control socket: the last relay of stage 1 leaves gracefully, the run pauses
        reply = await trio.to_thread.run_sync(lambda: ask(tmp_path / "r1_0", "leave"))
        assert reply["graceful"] and reply["pid"] == swarm.procs["r1_0"].pid
        assert await wait_exit(swarm, "r1_0", 60) == 0
        # (the data node pauses once r1_0 announced its leave; its Goodbye, the "left" event, may come after)
        paused = await wait_for(lambda: (x := ask(tmp_path / "d0", "status")["status"])["node"]["state"] == "paused"
                                and "r1_0 left" in [e["text"] for e in x["events"]] and x, 60,
                                "the data node pauses on the empty stage and says r1_0 left")
        assert any("stage 1 has no relay ready" in n for n in paused["notes"])
        gone = subprocess.run([sys.executable, "-m", "gwtf_node.cli", "status", "--state-dir",
                               str(tmp_path / "r1_0")], capture_output=True, text=True, timeout=60)
        assert gone.returncode == 1 and "no node is running" in gone.stderr
    finally:
        await trio.to_thread.run_sync(swarm.stop)
