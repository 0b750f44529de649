"""The tier markers of tests/conftest.py follow what a test uses, through the helpers it calls; helpers.until."""

from __future__ import annotations

from conftest import uses_any


class Swarm:
    """Stands for `LocalSwarm`: the target whose use is looked for."""


def _starts_a_swarm():
    return Swarm()


def _calls_a_helper_that_starts_one():
    def inner():
        return _starts_a_swarm()

    return inner


def _does_not():
    return len("Swarm")


def test_a_direct_use_is_found() -> None:
    assert uses_any(_starts_a_swarm, (Swarm,), globals())


def test_a_use_through_helpers_and_nested_functions_is_found() -> None:
    assert uses_any(_calls_a_helper_that_starts_one, (Swarm,), globals())


def test_a_name_in_a_string_is_not_a_use() -> None:
    assert not uses_any(_does_not, (Swarm,), globals())


def test_recursion_terminates() -> None:
    def a():
        return b()

    def b():
        return a()

    namespace = {"a": a, "b": b, "__name__": __name__}
    assert not uses_any(a, (Swarm,), namespace)


# ---- helpers.until ------------------------------------------------------------------------------------------

import pytest  # noqa: E402
from support.helpers import until  # noqa: E402


@pytest.mark.trio
async def test_until_returns_the_value_and_fails_after_its_deadline() -> None:
    calls = []
    assert await until(lambda: calls.append(1) or len(calls) >= 3 and "ok", "three calls") == "ok"
    with pytest.raises(AssertionError, match="never: not within 0.05 s"):
        await until(lambda: False, "never", timeout=0.05)
