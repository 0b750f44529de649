"""The shape of the package: no import cycle in `gwtf_node/`, no source file over the size limit.

A cycle makes the import order matter and hides which layer a module belongs
to; a file over `MAX_LINES` usually holds more than one mechanism.  The
graph is read from the sources with `ast` (nothing is imported): every import
at any depth, also inside functions, relative imports resolved, each edge to
the most specific module of the package it names; imports under
`if TYPE_CHECKING:` (annotations only, never executed) are left out.  An
import by string with a literal name (`importlib.import_module("a.b")`,
`import_module("a.b")`, `__import__("a.b")`) is an edge like `import a.b`,
so a cycle cannot hide behind one; and inside `gwtf_node/` there is none at
all: no `importlib`, no `__import__` (what a module runs is a parameter).
Generated protobuf code (`*_pb2.py`) is exempt from the limit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest
from helpers import PKG, ROOT, imports, module_name, package_of, source_files

MAX_LINES = 600


def _exempt(path: Path) -> bool:
    return path.name.endswith("_pb2.py")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def oversized(files: list[Path], root: Path = ROOT, limit: int = MAX_LINES) -> dict[str, int]:
    """Path relative to `root` -> line count of every non-generated file over `limit` lines."""
    return {str(p.relative_to(root)): n for p in files if not _exempt(p) and (n := _lines(p)) > limit}


def string_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(module, line) of every import by string with a literal absolute name: `importlib.import_module("a.b")`,
    `import_module("a.b")`, `__import__("a.b")`."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        arg = node.args[0]
        if name in ("import_module", "__import__") and isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
                and not arg.value.startswith("."):
            out.append((arg.value, node.lineno))
    return out


def dynamic_imports(tree: ast.AST, package: str) -> list[str]:
    """What in `tree` imports by string, whatever the name: an import of `importlib`, a use of `__import__`."""
    found = [f"line {line}: imports {name}" for name, line, names in imports(tree, package)
             if name == "importlib" or name.startswith("importlib.")]
    found += [f"line {node.lineno}: calls __import__" for node in ast.walk(tree)
              if isinstance(node, ast.Name) and node.id == "__import__"]
    return found


def import_graph(sources: dict[str, tuple[str, str]]) -> nx.DiGraph:
    """Module -> the modules of the same tree it imports.  `sources`: module -> (package, source).

    `from p import x` is an edge to `p.x` when that is a module of the tree,
    else to `p`; `import a.b` to the longest prefix of `a.b` that is one."""
    g = nx.DiGraph()
    g.add_nodes_from(sources)

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            if (cand := ".".join(parts[:n])) in sources:
                return cand
        return None

    for mod, (package, text) in sources.items():
        tree = ast.parse(text)
        found = [(name, line, names) for name, line, names in imports(tree, package, runtime_only=True)]
        found += [(name, line, ()) for name, line in string_imports(tree)]
        for name, line, names in found:
            targets = [resolve(f"{name}.{a}") for a in names] if names else [resolve(name)]
            for target in targets:
                if target is not None and target != mod:
                    g.add_edge(mod, target, line=line)
    return g


def cycles(g: nx.DiGraph) -> list[tuple[frozenset[str], list[str]]]:
    """Each strongly connected component of more than one module, with one cycle through it as proof."""
    out = []
    for comp in nx.strongly_connected_components(g):
        if len(comp) > 1:
            sub = g.subgraph(comp)
            edges = nx.find_cycle(sub, source=min(comp))
            out.append((frozenset(comp), [a for a, _ in edges] + [edges[-1][1]]))
    return sorted(out, key=lambda c: sorted(c[0]))


def _describe(g: nx.DiGraph, path: list[str]) -> str:
    return " -> ".join(f"{a} (line {g.edges[a, b]['line']})" for a, b in zip(path, path[1:])) + f" -> {path[-1]}"


def _package_sources() -> dict[str, tuple[str, str]]:
    return {module_name(p): (package_of(p) if p.name != "__init__.py" else module_name(p), p.read_text())
            for p in source_files(PKG)}


# ---- the tree -------------------------------------------------------------


def test_no_source_file_over_the_limit() -> None:
    over = oversized(source_files(PKG))
    assert not over, "over the {}-line limit (split by mechanism): {}".format(
        MAX_LINES, ", ".join(f"{p} has {n} lines" for p, n in sorted(over.items())))


def test_no_import_cycle() -> None:
    g = import_graph(_package_sources())
    found = cycles(g)
    assert not found, "import cycles in gwtf_node/:\n  " + "\n  ".join(_describe(g, path) for _, path in found)


@pytest.mark.parametrize("path", source_files(PKG), ids=lambda p: str(p.relative_to(PKG)))
def test_no_import_by_string(path: Path) -> None:
    found = dynamic_imports(ast.parse(path.read_text()), package_of(path))
    assert not found, f"{path.relative_to(ROOT)} imports by string (take what runs as a parameter):\n  " + \
        "\n  ".join(found)


# ---- the checks themselves ------------------------------------------------


def _graph(**modules: str) -> nx.DiGraph:
    """A tree of modules `pkg.<name>` (name `pkg` is the package's __init__) from their sources."""
    return import_graph({(n if n == "pkg" else f"pkg.{n}"): ("pkg", src) for n, src in modules.items()})


@pytest.mark.parametrize("modules", [
    {"a": "from . import b", "b": "from .a import f"},
    {"a": "import pkg.b", "b": "def f():\n    from pkg import a\n"},  # inside a function counts too
    {"a": "from .b import x", "b": "from .c import y", "c": "from .a import z"},
    {"pkg": "from .a import x", "a": "from . import b", "b": "from pkg import thing"},  # through __init__
    {"a": "from . import b", "b": "import importlib\ndef f():\n    importlib.import_module('pkg.a').main()\n"},
    {"a": "from . import b", "b": "from importlib import import_module\nm = import_module('pkg.a')\n"},
    {"a": "from . import b", "b": "m = __import__('pkg.a')\n"},
])
def test_cycles_are_found(modules: dict) -> None:
    found = cycles(_graph(**modules))
    assert len(found) == 1
    comp, path = found[0]
    assert path[0] == path[-1] and set(path) == comp


@pytest.mark.parametrize("modules", [
    {"a": "from . import b", "b": "import json"},
    {"a": "from .b import f", "b": "from .c import g", "c": "x = 1"},
    {"a": "import pkgx", "pkgx": "from pkg import a"},  # pkgx is not in the tree: a prefix is not a module
    {"a": "from . import b", "b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"},
])
def test_no_false_cycles(modules: dict) -> None:
    assert cycles(_graph(**modules)) == []


@pytest.mark.parametrize("src, found", [
    ("import importlib\nimportlib.import_module(name)", ["line 1: imports importlib"]),
    ("from importlib import import_module", ["line 1: imports importlib"]),
    ("import importlib.util", ["line 1: imports importlib.util"]),
    ("m = __import__('json')", ["line 1: calls __import__"]),
    ("import json\nfrom . import importer\nimport_module = 1", []),
])
def test_imports_by_string_are_found(src: str, found: list[str]) -> None:
    assert dynamic_imports(ast.parse(src), "pkg") == found


def test_a_cycle_is_described_with_its_lines() -> None:
    g = _graph(a="import os\nfrom . import b", b="\n\nfrom .a import f")
    (_, path), = cycles(g)
    assert _describe(g, path) == "pkg.a (line 2) -> pkg.b (line 3) -> pkg.a"


def test_size_limit(tmp_path: Path) -> None:
    small, big, generated = tmp_path / "small.py", tmp_path / "big.py", tmp_path / "x_pb2.py"
    small.write_text("x = 1\n" * MAX_LINES)
    big.write_text("x = 1\n" * (MAX_LINES + 1))
    generated.write_text("x = 1\n" * 5000)
    assert oversized([small, big, generated], root=tmp_path) == {"big.py": MAX_LINES + 1}
