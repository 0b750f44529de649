#!/usr/bin/env python3
"""Run the multi-process and network-lab tiers of the test suite N times and count each test's failures.

    python scripts/soak_tests.py [--runs 5] [--load 2] [--json] [-k EXPR] [-m EXPR] [-n 3] [PATH ...]

Theory of operation
-------------------
Each run is one `python -m pytest` over the selected tests (by default the
tiers `-m "multiprocess or netlab"`, every test file; `-k`, `-m` and paths
narrow it), in `-n` pytest-xdist workers with `--dist loadgroup` as CI runs
them (`-n 0`: one process), writing a JUnit XML report that this script reads
back: per test, passed, failed (a failure or an error, with the first line of
its message) or skipped.  A run is bounded by `--timeout` seconds: past it,
pytest's process group gets Ctrl-C (its fixtures and `finally` blocks stop
their swarms), then SIGKILL after a grace period; its tests that reported
nothing count as failed with "run timed out".

`--load K` starts K busy-loop processes for the whole soak (a loaded machine
is where timing assumptions break); they are stopped on exit, on Ctrl-C and
on failure, and each also stops by itself once this script is gone.

The summary: one line per test, `failures/runs`, then the distinct first
lines of its failures with how often each came.  `--json` prints one JSON
object per test instead: `test`, `runs`, `failures`, `skipped`,
`failure_lines` (the first line of each failure, in run order).  The exit
status is 0 when nothing failed, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MARKERS = "multiprocess or netlab"
COLLECT_TIMEOUT_S = 600.0
GRACE_S = 60.0  # after Ctrl-C at a run's timeout, before SIGKILL
BUSY_LOOP = (  # a busy loop that ends once its parent (this script) is gone
    "import os\n"
    "parent = os.getppid()\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(1_000_000):\n"
    "        pass\n"
)


@dataclass
class Tally:
    runs: int = 0
    skipped: int = 0
    failure_lines: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------- load
def start_load(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL) for _ in range(k)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


# ---------------------------------------------------------------------- one run
def pytest_command(args: argparse.Namespace, xml: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", args.markers, f"--junitxml={xml}",
           "-o", "junit_logging=no"]
    if args.k:
        cmd += ["-k", args.k]
    if args.workers > 0:
        cmd += ["-n", str(args.workers), "--dist", "loadgroup"]
    return cmd + list(args.paths)


def run_once(cmd: list[str], timeout_s: float, log) -> tuple[int | None, float]:
    """Run pytest (its own process group); (exit status or None if it timed out, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s), time.monotonic() - t0
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        return None, time.monotonic() - t0
    finally:
        if proc.poll() is None:  # Ctrl-C or a failure of this script: the run goes too
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGINT, GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def read_report(xml: Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome: passed / failed / skipped, first line of the failure) from a JUnit XML report."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        if not case.get("name"):  # (what an interrupted run reports of itself)
            continue
        test = _test_id(case.get("classname", ""), case.get("name", ""))
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            text = (bad.get("message") or bad.text or type(bad).__name__).strip()
            first = text.splitlines()[0] if text else bad.tag
            prev = out.get(test)
            if prev is None or prev[0] != "failed":  # (a teardown error after a failure: the failure comes first)
                out[test] = ("failed", first[:300])
        elif case.find("skipped") is not None:
            out.setdefault(test, ("skipped", ""))
        else:
            out.setdefault(test, ("passed", ""))
    return out


def _test_id(classname: str, name: str) -> str:
    """pytest's node id from JUnit's classname (dotted: tests.test_foo or tests.test_foo.TestBar) and name."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (ROOT / path).is_file():
            return "::".join([path, *parts[i:], name])
    return f"{classname}::{name}"


def collect(args: argparse.Namespace) -> list[str]:
    """The node ids of the selected tests (pytest --collect-only)."""
    cmd = pytest_command(args, Path(os.devnull))
    cmd = [c for c in cmd if not c.startswith("--junitxml")]
    if args.workers > 0:
        cmd = cmd[:cmd.index("-n")] + cmd[cmd.index("-n") + 4:]
    got = subprocess.run([*cmd, "--collect-only"], cwd=ROOT, capture_output=True, text=True,
                         timeout=COLLECT_TIMEOUT_S)
    if got.returncode not in (0, 5):  # (5: nothing selected)
        raise SystemExit(f"collecting the tests failed (status {got.returncode}):\n{got.stdout[-3000:]}{got.stderr}")
    return [line.strip() for line in got.stdout.splitlines() if "::" in line and not line.startswith(" ")]


# ---------------------------------------------------------------------- the soak
def soak(args: argparse.Namespace) -> dict[str, Tally]:
    selected = collect(args)
    if not selected:
        raise SystemExit("no test selected")
    print(f"{len(selected)} tests selected, {args.runs} runs, {args.load} busy loops", file=sys.stderr, flush=True)
    tallies: dict[str, Tally] = {}
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    for i in range(1, args.runs + 1):
        xml = workdir / f"run{i}.xml"
        logpath = workdir / f"run{i}.log"
        with open(logpath, "wb") as log:
            rc, took = run_once(pytest_command(args, xml), args.timeout, log)
        report = read_report(xml) if xml.exists() else {}
        if rc is None:
            why = f"run timed out after {args.timeout:.0f} s"
        elif not report or rc not in (0, 1):
            why = f"pytest exited with status {rc} (see {logpath})"
        else:
            why = ""
        if why:  # every selected test that reported nothing in this run failed with it
            for test in selected:
                if test not in report:
                    report[test] = ("failed", why)
        for test, (outcome, first) in report.items():
            t = tallies.setdefault(test, Tally())
            t.runs += 1
            if outcome == "failed":
                t.failure_lines.append(first)
            elif outcome == "skipped":
                t.skipped += 1
        failed = sum(1 for o, _ in report.values() if o == "failed")
        print(f"run {i}/{args.runs}: {len(report)} tests, {failed} failed, {took:.0f} s"
              f"{' (' + why + ')' if why else ''}; log {logpath}", file=sys.stderr, flush=True)
    return tallies


def print_table(tallies: dict[str, Tally]) -> None:
    width = max((len(t) for t in tallies), default=10)
    for test in sorted(tallies):
        t = tallies[test]
        note = f"  ({t.skipped} skipped)" if t.skipped else ""
        print(f"{test:<{width}}  {len(t.failure_lines)}/{t.runs}{note}")
        for line, n in Counter(t.failure_lines).most_common():
            print(f"    {n}x {line}")
    bad = sum(1 for t in tallies.values() if t.failure_lines)
    print(f"{len(tallies)} tests, {bad} failed at least once")


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", help="test files or node ids (default: every test file)")
    p.add_argument("--runs", type=int, default=5, help="runs of the selection (default 5)")
    p.add_argument("--load", type=int, default=0, metavar="K", help="busy-loop processes during the soak (default 0)")
    p.add_argument("-m", dest="markers", default=DEFAULT_MARKERS,
                   help=f"pytest marker expression (default {DEFAULT_MARKERS!r})")
    p.add_argument("-k", default=None, help="pytest -k expression")
    p.add_argument("-n", dest="workers", type=int, default=3,
                   help="pytest-xdist workers, --dist loadgroup as CI (default 3; 0: no xdist)")
    p.add_argument("--timeout", type=float, default=2400.0, metavar="S", help="bound of one pytest run (default 2400)")
    p.add_argument("--json", action="store_true", help="one JSON object per test instead of the table")
    args = p.parse_args(argv)
    if args.runs < 1 or args.load < 0 or args.timeout <= 0 or args.workers < 0:
        p.error("--runs must be >= 1, --load and -n >= 0, --timeout > 0")

    signal.signal(signal.SIGTERM, _terminated)  # (so that the load and a run in progress are stopped)
    # Ctrl-C works also where this script started with SIGINT ignored (a background job of a script), and pytest,
    # started from here, takes the Ctrl-C of a timeout (its fixtures stop their swarms)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    load = start_load(args.load)
    try:
        tallies = soak(args)
    finally:
        stop_load(load)
    if args.json:
        for test in sorted(tallies):
            t = tallies[test]
            print(json.dumps({"test": test, "runs": t.runs, "failures": len(t.failure_lines), "skipped": t.skipped,
                              "failure_lines": t.failure_lines}))
    else:
        print_table(tallies)
    return 1 if any(t.failure_lines for t in tallies.values()) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
