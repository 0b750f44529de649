"""Helpers for the tests that start swarms of processes (every wait has a deadline)."""

from __future__ import annotations

import trio

from gwtf_node.runtime.local import LocalSwarm


async def wait_records(swarm: LocalSwarm, n: int, timeout: float) -> list[dict]:
    """Wait until the leader has recorded `n` iterations; fails after `timeout` s or if a node died."""
    with trio.fail_after(timeout):
        while len(recs := swarm.records()) < n:
            swarm._check_alive()
            await trio.sleep(0.2)
    return recs
