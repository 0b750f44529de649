"""`scripts/bench_swarm_size.py`: what it reads from each node's status.json, the per-node figures over a window,
the loss check against the centralized reference, the table; and one run at a tiny size (a multi-process test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_script("bench_swarm_size")


def _status(name: str, role: str, t: float, iteration: int, ctrl: dict, cpu: float, compute: float) -> dict:
    return {"name": name, "role": role, "stage": 0 if role == "relay" else None, "pid": 1, "time": t,
            "iteration": iteration, "compute_s": compute, "resources": {"cpu_s": cpu},
            "peers": {"A": {"connection": "direct"}, "B": {"connection": "none"}, "C": {"connection": "relayed"}},
            "sent": {"ctrl": ctrl, "payload": {"Forward": [9, 9000]}, "dht": {"get": 1}}}


def test_per_node_figures_over_the_nodes_own_iterations() -> None:
    b = _bench()
    before = b.reading(_status("r0_0", "relay", 100.0, 3, {"Ping": [10, 700], "CostAnnounce": [4, 400]}, 2.0, 0.5),
                       loop_cpu_s=1.0)
    after = b.reading(_status("r0_0", "relay", 120.0, 13, {"Ping": [30, 2100], "CostAnnounce": [6, 600],
                                                           "CanTake": [10, 500]}, 4.0, 1.5), loop_cpu_s=1.8)
    assert (after["peers"], after["connected"]) == (3, 2)  # "none": known, not connected
    assert (after["ctrl_frames"], after["ctrl_bytes"], after["flow_frames"]) == (46, 3200, 6)
    fig = b.per_node(before, after, iterations=99)  # the node's own iterations win over the leader's count
    assert fig["iterations"] == 10 and fig["seconds"] == 20.0
    assert fig["ctrl_frames_per_it"] == 3.2 and fig["ctrl_bytes_per_it"] == 210 and fig["ctrl_bytes_per_s"] == 105
    assert fig["flow_msgs_per_it"] == 0.2
    assert fig["loop_cpu_ms_per_it"] == 80.0  # (1.8 - 1.0) s over 10 iterations
    assert fig["cpu_minus_compute_ms_per_it"] == 100.0 and fig["compute_ms_per_it"] == 100.0
    assert fig["ctrl_kinds_per_it"] == {"CanTake": 1.0, "CostAnnounce": 0.2, "Ping": 2.0}
    same = b.per_node(before, b.reading(_status("r0_0", "relay", 121.0, 3, {}, 2.0, 0.5), None), iterations=4)
    assert same["iterations"] == 4 and same["loop_cpu_ms_per_it"] is None  # no iteration of its own: the leader's
    summary = b.summarize([fig, {**fig, "name": "r0_1", "ctrl_bytes_per_it": 410}], {"r0_0": 5, "r0_1": 7})
    assert summary["relay"]["ctrl_bytes_per_it"] == {"mean": 310, "max": 410}
    assert summary["relay"]["flow_msgs_formation"] == {"mean": 6, "max": 7} and "data" not in summary


def test_the_flows_reading_counts_negative_labels_and_requests_sent_again() -> None:
    bench = _bench()
    a = _status("r0", "relay", 1.0, 3, {}, 1.0, 0.5)
    a["flow_machine"] = {"d0": {"out_cost": -2.0, "sent_again": 3}}
    b = _status("d0", "data", 1.0, 3, {}, 1.0, 0.5)
    b["flow_machine"] = {"d0": {"out_cost": 7.0, "sent_again": 1}}
    b["flows"] = {"d0": {"r0": 1}}
    got = bench.flow_cost({"r0": bench.reading(a, None), "d0": bench.reading(b, None)})
    assert (got["units"], got["negative_labels"], got["requests_sent_again"]) == (1, 1, 4)


def test_losses_are_checked_against_the_reference_and_the_table_says_so() -> None:
    b = _bench()
    recs = [{"iteration": i, "loss": x, "microbatches": 6} for i, x in enumerate([5.5, 5.4, 5.3])]
    assert b.check_losses(recs, [5.5, 5.4, 5.3], 6) == []
    assert b.check_losses(recs, [5.5, 5.4, 5.2], 6) == ["iteration 2: loss 5.300000, centralized 5.200000"]
    assert b.check_losses(recs[:2] + [{**recs[2], "microbatches": 5}], [5.5, 5.4, 5.3], 6) == [
        "iteration 2: 5 microbatches, expected 6"]
    assert b.check_losses(recs[1:], [5.4, 5.3], 6)[0].startswith("iterations [1, 2]")
    fig = {k: {"mean": 1.0, "max": 2.0} for k in ("peers", "connected", "ctrl_frames_per_it", "ctrl_bytes_per_it",
                                                     "ctrl_bytes_per_s", "flow_msgs_per_it", "loop_cpu_ms_per_it",
                                                     "cpu_minus_compute_ms_per_it", "compute_ms_per_it",
                                                     "flow_msgs_formation")}
    row = {"nodes": 26, "data_nodes": 2, "stages": 8, "relays_per_stage": 3, "startup_s": 40.0,
           "seconds_per_iteration": 1.5, "window_seconds_per_iteration": 2.5, "summary": {"relay": fig, "data": fig},
           "losses_equal": True,
           "memory": {"pss_mb_mean": 95.0, "uss_mb_mean": 60.0},
           "cpu": {"swarm_cores": 1.2, "machine_busy_cores": 1.9}}
    big = {**row, "nodes": 106, "relays_per_stage": 13,
           "summary": {"relay": {**fig, "ctrl_bytes_per_it": {"mean": 1.5, "max": 3.0}}}, "losses_equal": False}
    failed = {"nodes": 210, "data_nodes": 2, "stages": 8, "relays_per_stage": 26, "error": "MemAvailable fell"}
    text = b.table([row, big, failed])
    lines = text.splitlines()
    assert len(lines) == 5 and all(ln.count("|") == lines[0].count("|") for ln in lines), text
    assert "| 26 (2 + 8 x 3) | 40.0 s | 1.5 | 2.5 |" in lines[2] and lines[2].endswith("| equal |")
    assert "| 1.2 (1.9) | 95.0 / 60.0 |" in lines[2] and lines[3].endswith("| DIFFER |") and "failed: MemAvailable fell" in lines[4]
    assert b.flatness([row, big, failed]) == 1.5


def test_losses_are_compared_up_to_the_order_horizon() -> None:
    b = _bench()
    recs = [{"iteration": i, "loss": x, "microbatches": 6} for i, x in enumerate([5.5, 5.4, 5.3, 5.2])]
    ref = [5.5, 5.4, 5.3, 5.1]
    assert b.departs([5.5, 5.4, 5.302, 5.2], ref) == 2 and b.departs(ref, ref) is None
    assert b.check_losses(recs, ref, 6, horizon=3) == []  # the reference in reverse order left 1e-6 at 3
    assert b.check_losses(recs, ref, 6, horizon=4) == ["iteration 3: loss 5.200000, centralized 5.100000"]
    row = {"losses_equal": True, "first_departure": 3, "order_horizon": 3}
    assert b.verdict(row) == "equal to it 3 (order horizon; swarm leaves 1e-4 at 3)"
    assert b.verdict({**row, "first_departure": None}) == "equal" and b.verdict({**row, "losses_equal": False}) == "DIFFER"


def test_a_failed_size_says_when_its_nodes_presumed_each_other_dead() -> None:
    b = _bench()
    line = "2026-11-30 05:{:02d}:{:02d},732 WARNING gwtf.node: peer r8_2 presumed dead: silent for 6.9 s (deadline {} s)"
    a = "\n".join([line.format(3, 35, "6.0"), "2026-11-30 05:03:36,000 INFO gwtf.node: redialling r8_2, presumed dead",
                   line.format(4, 1, "14.8")])
    c = "\n".join([line.format(3, 59, "6.0"), line.format(2, 10, "7.7")])
    assert b.dead_events([a, c]) == {"presumed_dead_events": 4, "presumed_dead_peak_minute": "05:03",
                                     "presumed_dead_in_peak_minute": 2, "presumed_dead_at_floor": 2}
    assert b.dead_events([]) == {"presumed_dead_events": 0, "presumed_dead_peak_minute": None,
                                 "presumed_dead_in_peak_minute": 0, "presumed_dead_at_floor": 0}


def test_every_stage_sums_what_the_data_nodes_settled(tmp_path: Path) -> None:
    b = _bench()
    settled = ("x INFO gwtf.steps: iteration 0 settled: completed [0, 1], deferred 0\n"
               "x INFO gwtf.steps: iteration 1 settled: completed [2, 3], deferred 0\n")
    summed = ('x INFO gwtf.steps: iteration {t}: summed in round s{s}/it{t}/ab: contributions {keys}; aggregation 0.1 s\n')
    logs = {"d0": ("data", settled),
            "r0_0": ("relay", summed.format(t=0, s=0, keys='[["d0", 0]]') + summed.format(t=1, s=0, keys='[["d0", 2], ["d0", 3]]')),
            "r0_1": ("relay", summed.format(t=0, s=0, keys='[["d0", 1]]') + summed.format(t=1, s=0, keys='[]')),
            "r1_0": ("relay", summed.format(t=0, s=1, keys='[["d0", 0], ["d0", 1]]')
                     + summed.format(t=1, s=1, keys='[["d0", 2]]'))}
    assert b.check_ledger(logs, 2) == [
        "iteration 1 stage 1: summed 1 of 2 settled microbatches (missing [('d0', 3)], not settled [], twice 0)"]
    assert b.check_ledger({k: v for k, v in logs.items() if k != "r1_0"}, 2) == []
    assert b.check_ledger({**logs, "r1_0": ("relay", summed.format(t=0, s=1, keys='[["d0", 0], ["d0", 1]]'))}, 2) == [
        "iteration 1 stage 1: no relay logged its sum"]
    # every microbatch summed, but by two relays stepping alone: their copies of the stage differ
    alone = 'x INFO gwtf.steps: iteration 0: summed in round s0/it0/alone: contributions {keys}; aggregation 0.1 s\n'
    split = {**logs, "r0_0": ("relay", alone.format(keys='[["d0", 0]]') + summed.format(t=1, s=0, keys='[["d0", 2], ["d0", 3]]')),
             "r0_1": ("relay", alone.format(keys='[["d0", 1]]') + summed.format(t=1, s=0, keys='[]'))}
    assert b.check_ledger(split, 2)[0] == ("iteration 0 stage 0: its relays summed in 2 rounds (s0/it0/alone (r0_0), "
                                           "s0/it0/alone (r0_1))")
    (tmp_path / "node.log.2").write_text("a\n")
    (tmp_path / "node.log.1").write_text("b\n")
    (tmp_path / "node.log").write_text("c\n")
    assert b.node_log(tmp_path) == "a\nb\nc\n"


def test_bad_arguments_get_one_line() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_swarm_size.py"), "--nodes", "5",
                          "--stages", "8"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "bench_swarm_size: every --nodes must be at least --data-nodes + --stages (10)"]
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_swarm_size.py"), "--flow-neighbours", "-1"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == ["bench_swarm_size: use --flow-neighbours >= 0"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_tiny_swarm_is_measured_and_trains_as_the_reference(tmp_path: Path) -> None:
    """1 data node and 2 stages of 1 relay: the row of that size, its losses equal to the centralized ones (the
    daemons given `--flow-neighbours 1`: a stage of one relay is linked whole)."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_swarm_size.py"), "--nodes", "3",
                          "--stages", "2", "--data-nodes", "1", "--warmup", "1", "--iterations", "2", "--window", "3",
                          "--flow-neighbours", "1", "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = [json.loads(line) for line in out.stdout.splitlines()]
    assert row["nodes"] == 3 and row["losses_equal"] and row["losses"] == row["centralized"]
    assert row["flow_neighbours"] == 1
    relays = [n for n in row["per_node"] if n["role"] == "relay"]
    assert len(relays) == 2 and all(n["connected"] == 2 for n in relays)  # the data node and the other stage
    assert all(n["iterations"] >= 1 and n["ctrl_frames_per_it"] > 0 for n in relays)
    assert row["window_seconds_per_iteration"] >= 0.9 * row["seconds_per_iteration"] > 0  # (plus the aggregation)
    assert row["memory"]["pss_mb_mean"] > 0 and 0 < row["cpu"]["swarm_cores"] and "| 3 (1 + 2 x 1) |" in out.stderr
