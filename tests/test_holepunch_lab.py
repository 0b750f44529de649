"""Hole punching (DCUtR) between two homes, in the network lab: the relayed connection becomes a direct one.

Lab as in tests/test_swarm_lab.py: d0 public (the bootstrap and a circuit
relay, `--relay-service`), the stage-0 relay behind home router A, the
stage-1 relay behind home router B, both routers dropping unsolicited
inbound.  The two homes first reach each other through d0's relay; both run
DCUtR (gwtf_node/runtime/holepunch.py).

* Routers that keep the source port: the home-to-home connection becomes
  "hole-punched" in both homes' status, both ends move their streams to it
  (none left on the relayed connection), the library closes the relayed
  connection 60 s later, and training goes on past that; every iteration's
  loss equals the centralized reference within 1e-4 relative.
* Router B picks random source ports: every hole punch fails, the connection
  stays "relayed", and training goes on with the same losses.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import labutil
import pytest
from swarmutil import log_digest, status
from test_netlab import dial, serve

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized
from gwtf_node.runtime.local import LocalSwarm

pytestmark = [pytest.mark.netlab, pytest.mark.multiprocess, pytest.mark.slow]
lab = labutil.lab  # the fixture

HOMES = ("r0_0", "r1_0")
MAX_ITERATIONS = 2000  # a ceiling: the test stops the swarm once it has seen what it waits for
UPGRADE_TIMEOUT_S = 60.0  # training started -> both homes see each other hole-punched, streams moved
RELAY_CLOSED_TIMEOUT_S = 100.0  # upgrade -> relayed connection closed (the library waits 60 s)
FAILED_TIMEOUT_S = 90.0  # training started -> a failed punch on both homes (3 rounds of 5 s + 2 s pauses)
AFTER = 5  # iterations that must complete after the last event waited for


def _other(name: str) -> str:
    return HOMES[1 - HOMES.index(name)]


def _punch(workdir: Path, name: str) -> tuple[str | None, dict | None, dict]:
    """How `name` reaches the other home ("hole-punched+libp2p", ...), its hole-punch row for it, the counts."""
    st = status(workdir, name)
    pid, row = next(((k, p) for k, p in st.get("peers", {}).items() if p.get("name") == _other(name)), (None, {}))
    hp = (st.get("reachability") or {}).get("hole_punch") or {}
    return row.get("connection"), (hp.get("peers") or {}).get(pid), hp


def test_random_ports_router_changes_the_source_port(lab):
    pub, home = lab.public("p"), lab.home("a", random_ports=True)
    srv = serve(lab, pub)
    pairs = []
    for _ in range(2):
        out = dial(lab, home.hosts[0], pub.ip)
        assert out.returncode == 0, out.stdout + out.stderr
        pairs.append((out.stdout.split()[0], srv.stdout.readline().split()[1]))
    assert any(local != seen for local, seen in pairs), pairs  # (a port kept by chance: 1 in ~28000 per dial)


@pytest.mark.parametrize("router_b", ["port-preserving", "random-ports"])
def test_two_homes_hole_punch_and_keep_training(lab, tmp_path: Path, router_b: str) -> None:
    punchable = router_b == "port-preserving"
    man = default_manifest(family="llama", stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=4)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    d0, a, b = lab.public("d0"), lab.home("a"), lab.home("b", random_ports=not punchable)
    where = {"d0": d0, "r0_0": a.hosts[0], "r1_0": b.hosts[0]}
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=1, iterations=MAX_ITERATIONS,
                       wrap={name: ["ip", "netns", "exec", node.ns] for name, node in where.items()},
                       extra_args={name: ["--listen", "0.0.0.0:4001", *(["--relay-service"] if name == "d0" else [])]
                                   for name in where})
    swarm.startup_timeout_s = 90
    swarm.iteration_timeout_s = 60
    records: list[dict] = []
    seen: dict[str, set] = {n: set() for n in HOMES}  # connection kinds each home saw for the other
    events: dict[str, float] = {}  # what happened -> time.monotonic()
    upgraded_at = None
    try:
        swarm.start()
        started = None
        for rec in swarm.iterations_done():
            records.append(rec)
            t = time.monotonic()
            started = started or t
            views = {n: _punch(tmp_path, n) for n in HOMES}
            for n, (kind, _row, _hp) in views.items():
                if kind:
                    seen[n].add(kind)
            if punchable:
                if "moved" not in events:
                    if all(k and k.startswith("hole-punched") and r and not r["relayed_streams"]
                           and r["direct_streams"] for k, r, _ in views.values()):
                        events["moved"] = upgraded_at = t
                        print(f"streams moved at iteration {rec['iteration']}: {json.dumps(views)}")
                    elif t - started > UPGRADE_TIMEOUT_S:
                        pytest.fail(f"no hole punch within {UPGRADE_TIMEOUT_S:.0f} s: {json.dumps(views)}\n"
                                    + log_digest(tmp_path, where))
                elif "relay closed" not in events:
                    if all(r and r["relayed_conns"] == 0 for _, r, _ in views.values()):
                        events["relay closed"] = t
                        events["relay closed iteration"] = rec["iteration"]
                        print(f"relayed connection closed {t - upgraded_at:.1f} s after the upgrade, iteration "
                              f"{rec['iteration']}: {json.dumps(views)}")
                    elif t - upgraded_at > RELAY_CLOSED_TIMEOUT_S:
                        pytest.fail(f"relayed connection not closed within {RELAY_CLOSED_TIMEOUT_S:.0f} s of the "
                                    f"upgrade: {json.dumps(views)}")
                elif rec["iteration"] >= events["relay closed iteration"] + AFTER:
                    break
            else:
                if "failed" not in events:
                    if all(hp.get("failed") for _, _, hp in views.values()):
                        events["failed"] = rec["iteration"]
                        print(f"hole punches failed by iteration {rec['iteration']}: {json.dumps(views)}")
                    elif t - started > FAILED_TIMEOUT_S:
                        pytest.fail(f"no failed hole punch within {FAILED_TIMEOUT_S:.0f} s: {json.dumps(views)}")
                elif rec["iteration"] >= events["failed"] + AFTER:
                    break
    finally:
        swarm.stop()
    secs = [r["seconds"] for r in records[1:]]
    print(f"{len(records)} iterations, median {sorted(secs)[len(secs) // 2]:.3f} s; seen: {seen}", file=sys.stderr)
    if punchable:
        assert all(any(k.startswith("hole-punched") for k in seen[n]) for n in HOMES), seen
    else:
        assert all(k.startswith("relayed") for n in HOMES for k in seen[n]) and all(seen.values()), seen
    ref = train_centralized(man, len(records), data_nodes=1)
    assert [r["iteration"] for r in records] == list(range(len(records)))
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 4, (rec, log_digest(tmp_path, where))
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (rec, loss)
