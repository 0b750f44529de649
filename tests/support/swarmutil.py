"""Helpers for the tests that start swarms of processes (every wait has a deadline)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import trio

from gwtf_node.runtime.local.swarm import LocalSwarm


async def wait_for(pred: Callable[[], Any], timeout: float, what: str, swarm: LocalSwarm | None = None) -> Any:
    """Wait until `pred()` is truthy and return it; fails after `timeout` s (or if a node of `swarm` died)."""
    with trio.move_on_after(timeout):
        while True:
            if swarm is not None:
                swarm._check_alive()
            v = pred()
            if v:
                return v
            await trio.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


async def wait_records(swarm: LocalSwarm, n: int, timeout: float) -> list[dict]:
    """Wait until the leader has recorded `n` iterations; fails after `timeout` s or if a node died."""
    await wait_for(lambda: len(swarm.records()) >= n, timeout, f"{n} iterations recorded", swarm)
    return swarm.records()


async def wait_exit(swarm: LocalSwarm, name: str, timeout: float) -> int:
    """Wait until the process of node `name` exited; its return code."""
    p = swarm.procs[name]
    await wait_for(lambda: p.poll() is not None, timeout, f"{name} exits")
    return p.returncode


async def wait_summed(swarm: LocalSwarm, relays, n: int, timeout: float) -> None:
    """Wait until each of `relays` logged its stage's sum ("iteration t: summed in round ...", aggregation.py) of
    every iteration t < `n`; fails after `timeout` s or if a node died.

    The leader records an iteration once the data nodes stepped; a relay sums the same iteration in its own
    all-reduce, possibly later (a BEGIN AGGREGATION resent after a lost copy reaches it seconds after the data
    nodes').  A test that rebuilds what each stage trained from the relays' logs waits for this before it stops
    the swarm: a relay stopped before its BEGIN arrived never sums that iteration."""
    pat = re.compile(r"iteration (\d+): summed in round ")

    def summed() -> bool:
        for r in relays:
            done = {int(t) for t in pat.findall(log_text(swarm.workdir, r))}
            if not done.issuperset(range(n)):
                return False
        return True

    await wait_for(summed, timeout, f"{', '.join(relays)} summed iterations 0-{n - 1}", swarm)


def status(workdir: Path, name: str) -> dict:
    """A node's status.json ({} while it does not exist or is being replaced)."""
    try:
        return json.loads((workdir / name / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def fresh_statuses(workdir: Path, names, timeout: float) -> dict[str, dict]:
    """Each node's status.json written after this call (a node rewrites it every second): what the nodes say now,
    not a second ago.  Blocking (for tests that drive a swarm without trio); fails after `timeout` s."""
    def mtime(name: str) -> int:
        try:
            return (workdir / name / "status.json").stat().st_mtime_ns
        except OSError:
            return 0

    since = {n: mtime(n) for n in names}
    deadline = time.monotonic() + timeout
    while not all(mtime(n) > since[n] for n in names):
        if time.monotonic() > deadline:
            stale = [n for n in names if mtime(n) <= since[n]]
            raise AssertionError(f"status.json of {', '.join(stale)} not rewritten within {timeout:.0f} s")
        time.sleep(0.1)
    return {n: status(workdir, n) for n in names}


def log_text(workdir: Path, name: str) -> str:
    path = workdir / name / "node.log"
    return path.read_text(errors="replace") if path.exists() else ""


DIGEST = ("settled", "flows formed", "through a relay", "joined the swarm", "presumed dead", "deferred", "denied", "back after", "refused", "failed",
          "WARNING", "ERROR", "state loaded", "summed without", "parameters")


def log_digest(workdir: Path, names, limit: int = 1500) -> str:
    """The lines of the nodes' logs that explain a wrong iteration record, short enough for an assertion message
    (CI prints a failing test's message whole, but not always its output): time, node, message."""
    out = []
    for name in names:
        for line in log_text(workdir, name).splitlines():
            if "auto_connector" in line or "gwtf" not in line or not any(w in line for w in DIGEST):
                continue
            stamp, _, rest = line.partition(" INFO ") if " INFO " in line else line.partition(" gwtf")
            out.append(f"{stamp[11:23]} {name}: {rest.split(': ', 1)[-1][:160]}")
    out.sort()
    text = " | ".join(out)
    return text if len(text) <= limit else "…" + text[-limit:]


def assert_losses(records: list[dict], want: list[float], rel: float = 1e-4) -> None:
    """Every record's loss equals the centralized reference's; on a difference, the first differing record whole
    (its completed / lost / deferred microbatches and its timing say whether a microbatch was given up there)."""
    assert len(records) == len(want), (len(records), len(want))
    off = [i for i, (r, loss) in enumerate(zip(records, want)) if r["loss"] != pytest.approx(loss, rel=rel)]
    if off:
        i = off[0]
        raise AssertionError(f"{len(off)} of {len(records)} losses differ from the reference, the first at index {i}: "
                             f"{records[i]['loss']} against {want[i]}; its record: {json.dumps(records[i])}; the one "
                             f"before: {json.dumps(records[i - 1]) if i else None}")


def order_horizon(reference: list[float], reversed_order: list[float], tol: float = 1e-5) -> int:
    """How many iterations equal losses can be asked for of a run as long as `reference`: the first iteration
    where the reference trained in the reverse microbatch order (`train_centralized(reverse=True)`) departs from
    it by more than `tol` (relative), or all of them.  A swarm adds its microbatches in the order they arrive, and
    training amplifies that order's last-bit differences: with the test manifests' learning rate, the two orders
    differ by about 1e-6 at 50 iterations, 1e-4 at 100 and 3 % at 200.  So a test whose swarm trains as many
    iterations as its other checks take compares the losses before the horizon (tol well under assert_losses'
    1e-4) and its later records' microbatches alone."""
    return next((t for t, (x, y) in enumerate(zip(reversed_order, reference)) if abs(x - y) > tol * abs(y)),
                len(reference))
