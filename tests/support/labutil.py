"""The network lab for tests: a `lab` fixture that skips with one line where namespaces cannot be made.

Tests that use it carry the `netlab` marker (set by the fixture's module
through `pytestmark`, or by hand), so `-m "not netlab"` leaves them out.
"""

from __future__ import annotations

import functools

import pytest

from gwtf_node.testing.netlab import NetLab, lab_unavailable, leftover_namespaces


@functools.cache
def unavailable() -> str | None:
    return lab_unavailable()


@pytest.fixture
def lab():
    """A fresh `NetLab`, removed after the test (its processes stopped, its namespaces deleted)."""
    why = unavailable()
    if why is not None:
        pytest.skip(f"network lab: {why}")
    with NetLab() as made:
        yield made
    assert not leftover_namespaces(made.prefix), "the lab left namespaces behind"


def public_swarm(lab: NetLab, workdir, run, names: list[str], *, extra: dict[str, list[str]] | None = None,
                 **swarm_args):
    """A `LocalSwarm` whose nodes (`names`, as the launcher names them) each sit in a namespace of their own on the
    lab's internet and listen on 0.0.0.0:4001; `extra`: more `join` flags by node name; the start-up and iteration
    waits bounded at 120 s (the fork server forks each node into its namespace).  Returns it and the lab node of each
    name."""
    from gwtf_node.runtime.local.swarm import LocalSwarm

    where = {name: lab.public(name.replace("_", "")) for name in names}
    swarm = LocalSwarm(workdir, run, netns={name: node.ns for name, node in where.items()},
                       extra_args={name: ["--listen", "0.0.0.0:4001", *(extra or {}).get(name, [])] for name in names},
                       **swarm_args)
    swarm.startup_timeout_s = 120
    swarm.iteration_timeout_s = 120
    return swarm, where
