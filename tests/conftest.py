"""Test tiers, applied by what a test uses, and the Hypothesis profiles.

Tiers (tests/README.md): `property` for Hypothesis tests (`@given`, also
inside the test function, and state machines), `multiprocess` for tests that start a swarm of daemon processes
(through `gwtf_node.runtime.local.swarm`: `LocalSwarm`, `run_local`, or marked
`multiprocess` by hand when it starts `gwtf-node join` processes itself), `unit` for
the rest.  A multi-process test is also `slow`.  The markers are set here at
collection, so a test module needs no marker of its own to be in its tier.

The tests sit in one directory per layer (protocol, model, sim, runtime,
swarm, lab, repo) and share the helpers of the `support` package; the layer
directories are on `sys.path`, so a test module may import a helper of a
test module of another layer by its name.

The suite runs in three pytest-xdist workers (`-n 3 --dist loadgroup`, the
README's test command): tests that share a fixture wider than one test (a
module's swarm) get one `xdist_group`, so that they run in one worker and the
fixture is set up once.  The slow tests are collected first, so that the fast
ones fill the workers' last minutes.

Hypothesis runs derandomized by default, so that CI is repeatable: the same
examples every run.  Explore with fresh random examples locally:
HYPOTHESIS_PROFILE=explore python -m pytest -q -m property (a failure found
that way goes into the test as an explicit @example).
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from pathlib import Path

# One torch thread per process: two pytest workers and their swarms share the machine's cores, and torch's
# OpenMP threads spin waiting for each other when a core is taken (a tiny model's step costs 30x the CPU under
# load with 2 threads).  Set before torch starts its pool; the daemons a test starts inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# A handler's fault (anything but FrameRefused) is raised in the tests, in-process nodes and the daemons a test
# starts alike (they inherit it): a daemon only logs it and runs on (runtime/node/routes.py `handler_fault`).
os.environ.setdefault("GWTF_RAISE_HANDLER_FAULTS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, is_hypothesis_test, settings  # noqa: E402

from gwtf_node.runtime.local import swarm as local  # noqa: E402

if os.environ["OMP_NUM_THREADS"] == "1":
    torch.set_num_threads(1)

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SWARM_STARTERS = (local.LocalSwarm, local.run_local)  # what makes a test multi-process
TESTS_DIR = Path(__file__).resolve().parent
LAYER_DIRS = sorted(d for d in TESTS_DIR.iterdir() if d.is_dir() and any(d.glob("test_*.py")))
sys.path[1:1] = [str(d) for d in LAYER_DIRS if str(d) not in sys.path]


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _is_test_helper(func) -> bool:
    """Whether `func` is defined in a module under tests/ (a shared helper such as restartutil's swarm builders,
    or a helper of another test module)."""
    path = getattr(getattr(func, "__code__", None), "co_filename", "")
    return TESTS_DIR in Path(path).resolve().parents


def uses_any(func, targets: tuple, namespace: dict, _seen: set | None = None) -> bool:
    """Whether `func` names one of `targets`, directly or through functions and classes of `namespace`."""
    seen = set() if _seen is None else _seen
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    for c in _code_objects(code):
        for name in c.co_names:
            obj = namespace.get(name)
            if obj is None:
                continue
            if any(obj is t for t in targets):
                return True
            if inspect.isfunction(obj) and obj.__module__ == namespace.get("__name__"):
                if uses_any(obj, targets, namespace, seen):
                    return True
            elif inspect.isfunction(obj) and _is_test_helper(obj):  # a helper of tests/ (swarmutil, restartutil)
                if uses_any(obj, targets, getattr(inspect.getmodule(obj), "__dict__", {}), seen):
                    return True
    return False


def _fixture_functions(item: pytest.Item):
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        for d in defs:
            yield d.func


def tier(item: pytest.Item) -> str:
    """"property", "multiprocess" or "unit": the tier of a collected test."""
    func = getattr(item, "obj", None)
    if func is None:
        return "unit"
    if item.get_closest_marker("multiprocess") is not None:  # marked by hand: it starts daemons another way
        return "multiprocess"
    namespace = getattr(item.module, "__dict__", {}) if getattr(item, "module", None) else {}
    if is_hypothesis_test(func) or uses_any(func, (given,), namespace):  # (also a @given inside the test)
        return "property"
    if any(uses_any(f, SWARM_STARTERS, getattr(inspect.getmodule(f), "__dict__", namespace))
           for f in (func, *_fixture_functions(item))):
        return "multiprocess"
    return "unit"


def shared_fixtures(item: pytest.Item) -> list[str]:
    """The fixtures of this project, wider than one test (module, package or session scope), that `item` uses."""
    info = getattr(item, "_fixtureinfo", None)
    out = []
    for name, defs in (info.name2fixturedefs.items() if info is not None else ()):
        d = defs[-1]
        if d.scope != "function" and d.baseid:  # (pytest's own, such as tmp_path_factory, have no baseid)
            out.append(f"{d.baseid}::{name}")
    return sorted(out)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        t = tier(item)
        item.add_marker(t)
        if t == "multiprocess":
            item.add_marker("slow")
        # tests that share a fixture (a module's swarm) run in one pytest-xdist worker (--dist loadgroup),
        # so that it is set up once
        shared = shared_fixtures(item)
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
    # the slow tests first (stable: each tier keeps its order), so that the fast ones fill the workers' last
    # minutes instead of one swarm running alone at the end
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
