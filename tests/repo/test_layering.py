"""Imports point one way (DESIGN.md "Layers", STYLE.md habits 1 and 3).

`protocol/` is pure: no I/O, no clock, no global randomness, no trio, libp2p,
torch or numpy, and nothing from the layers above it.  A machine gets a seeded
`random.Random` handed in, so `import random` is allowed there only to name
that type: any other use of the module `random` reads the global RNG.
`sim/` and `model/` must not reach up into `runtime/` or the command line.
`runtime/` is five rooms in an order (its `__init__.py`): a room imports only
from the rooms before it.

The check reads the source with `ast` (nothing is imported), sees imports at
any depth (also inside functions) and resolves relative imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest
from support.helpers import PKG, ROOT, imports, package_of, source_files

UPPER_LAYERS = ("gwtf_node.runtime", "gwtf_node.cli", "gwtf_node.status")
PROTOCOL_FORBIDDEN = (
    # I/O, clocks, concurrency: a machine is handed `now` and returns effects
    "time", "datetime", "socket", "selectors", "asyncio", "trio", "libp2p",
    "os", "threading", "multiprocessing", "subprocess", "importlib",
    # randomness other than a handed-in random.Random
    "secrets", "uuid",
    # heavy or effectful libraries
    "torch", "numpy",
    # the layers above, and the model
    *UPPER_LAYERS, "gwtf_node.sim", "gwtf_node.model",
)
SIM_FORBIDDEN = UPPER_LAYERS
MODEL_FORBIDDEN = (*UPPER_LAYERS, "gwtf_node.sim")


def _matches(name: str, prefixes: Iterable[str]) -> str | None:
    for prefix in prefixes:
        if name == prefix or name.startswith(prefix + "."):
            return prefix
    return None


def violations(source: str, package: str, forbidden: Iterable[str], pure: bool = False) -> list[str]:
    """Forbidden imports in `source`, a module of `package`; with `pure`, also uses of the global RNG."""
    forbidden = tuple(forbidden)
    found: list[str] = []
    random_names: set[str] = set()  # local names bound to the module `random`

    def check(name: str, line: int) -> None:
        if (hit := _matches(name, forbidden)) is not None:
            found.append(f"line {line}: imports {name} ({hit} is not allowed here)")

    tree = ast.parse(source)
    for name, line, names in imports(tree, package):
        check(name, line)
        for alias in names:
            check(f"{name}.{alias}", line)  # `from .. import runtime`
            if pure and name == "random" and alias != "Random":
                found.append(f"line {line}: from random import {alias} uses the global RNG")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "random":
                    random_names.add(alias.asname or "random")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            found.append(f"line {node.lineno}: __import__ hides what is imported")
    if pure:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in random_names
                and node.attr != "Random"
            ):
                found.append(
                    f"line {node.lineno}: {node.value.id}.{node.attr} uses the global RNG; "
                    "take a seeded random.Random as an argument"
                )
    return found


def _files(subpackage: str) -> list[Path]:
    return source_files(PKG / subpackage)


def _report(path: Path, found: list[str]) -> str:
    return f"{path.relative_to(ROOT)} breaks the layering:\n  " + "\n  ".join(found)


# ---- the tree -------------------------------------------------------------


def test_the_protocol_layer_is_found() -> None:
    names = {p.name for p in _files("protocol")}
    assert {"messages.py", "codec.py", "gwtf_pb2.py"} <= names


@pytest.mark.parametrize("path", _files("protocol"), ids=lambda p: p.name)
def test_protocol_is_pure(path: Path) -> None:
    found = violations(path.read_text(), package_of(path), PROTOCOL_FORBIDDEN, pure=True)
    assert not found, _report(path, found)


@pytest.mark.parametrize("path", _files("sim"), ids=lambda p: p.name)
def test_sim_does_not_import_runtime_or_cli(path: Path) -> None:
    found = violations(path.read_text(), package_of(path), SIM_FORBIDDEN)
    assert not found, _report(path, found)


@pytest.mark.parametrize("path", _files("model"), ids=lambda p: p.name)
def test_model_does_not_import_upper_layers(path: Path) -> None:
    found = violations(path.read_text(), package_of(path), MODEL_FORBIDDEN)
    assert not found, _report(path, found)


RUNTIME_ROOMS = ("ops", "net", "trust", "node", "local")  # each imports only the rooms before it


def test_runtime_is_its_rooms() -> None:
    runtime = PKG / "runtime"
    assert {p.name for p in runtime.glob("*.py")} == {"__init__.py"}, "a runtime module outside the rooms"
    assert {p.name for p in runtime.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(RUNTIME_ROOMS)


@pytest.mark.parametrize("room", RUNTIME_ROOMS)
def test_a_room_imports_only_the_rooms_before_it(room: str) -> None:
    above = tuple(f"gwtf_node.runtime.{r}" for r in RUNTIME_ROOMS[RUNTIME_ROOMS.index(room) + 1:])
    for path in _files(f"runtime/{room}"):
        found = violations(path.read_text(), package_of(path), (*above, "gwtf_node.cli"))
        assert not found, _report(path, found)


def test_the_room_check_flags_an_arrow_upwards() -> None:
    above = ("gwtf_node.runtime.node", "gwtf_node.runtime.local")
    assert violations("from ..node.flows import Flows", "gwtf_node.runtime.trust", above)
    assert violations("from gwtf_node.runtime.local import swarm", "gwtf_node.runtime.trust", above)
    assert violations("from ..net.peers import Peers", "gwtf_node.runtime.trust", above) == []


# ---- the checker itself ---------------------------------------------------

PROTO_PKG = "gwtf_node.protocol"


@pytest.mark.parametrize(
    "source",
    [
        "import time",
        "from time import monotonic",
        "import os.path",
        "import numpy as np",
        "from torch import nn",
        "def f():\n    import trio\n",
        "from ..runtime import host",
        "from .. import cli",
        "from ..sim.scenarios import FLOW_SETTINGS",
        "import gwtf_node.model.stage",
        "from gwtf_node import runtime",
        "import random\nx = random.random()",
        "import random\ndef f(xs):\n    random.shuffle(xs)\n",
        "import random as r\nr.seed(1)",
        "from random import choice",
        "m = __import__('time')",
    ],
)
def test_checker_flags(source: str) -> None:
    assert violations(source, PROTO_PKG, PROTOCOL_FORBIDDEN, pure=True)


@pytest.mark.parametrize(
    "source",
    [
        "import math\nfrom dataclasses import dataclass",
        "import timeit",  # a prefix of a name is not the name
        "from .messages import Label",
        "from . import gwtf_pb2 as pb",
        "from google.protobuf.message import DecodeError",
        "import random\ndef f(rng: random.Random) -> float:\n    return rng.random()\n",
        "from random import Random",
    ],
)
def test_checker_allows(source: str) -> None:
    assert violations(source, PROTO_PKG, PROTOCOL_FORBIDDEN, pure=True) == []


def test_relative_imports_resolve_from_the_package() -> None:
    # from gwtf_node/sim/x.py, `..protocol` is allowed and `..runtime` is not
    assert violations("from ..protocol.scenario import Scenario", "gwtf_node.sim", SIM_FORBIDDEN) == []
    assert violations("from ..runtime.net.host import Host", "gwtf_node.sim", SIM_FORBIDDEN)
    assert violations("from ...cli import main", "gwtf_node.sim.baselines", SIM_FORBIDDEN)


def test_package_of() -> None:
    assert package_of(PKG / "protocol" / "codec.py") == "gwtf_node.protocol"
    assert package_of(PKG / "protocol" / "__init__.py") == "gwtf_node.protocol"

