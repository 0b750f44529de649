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
