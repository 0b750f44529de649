"""State has one owner: a module of protocol/flow or protocol/recovery writes only the state objects it defines.

The flow machine (`FlowNode`) composes one state object per mechanism
(`LabelState` in labels.py, `UnitState` in units.py, ...), and the module that
defines a state class is the only one that mutates its objects; the others
read them or call that module's functions and that class's methods.  The
composite's own fields (`cfg`, `removed`, ...) are written only by node.py.
The recovery machine (`RecoveryNode`) is checked the same way: its mechanisms
(`Peers`, `Routing`, `RelaySide`, `DataSide`, `Rounds`) and their records
(`RelayRecord` in relay.py, `DataRecord` in data.py, a record's `RoundState`
in rounds.py) each have one writing module.  A composite field's owner is
the class it is built from (`C(...)`, `C.of(...)`) or the state class its
annotation names (`self.routing: Routing = ...`).

The check is static (AST): in every function of the package it follows the
objects a write can reach, i.e. the composite (`self` in its class, a
parameter annotated with it), an object of a state class (`self` in that
class, a parameter annotated with it) and local names bound to a part of
either, and flags an assignment, augmented assignment or `del` whose target
lies inside an object that another module owns, a call of a mutating method
(`pop`, `append`, ...) on one, and `add_one` / `take_one` on one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "gwtf_node" / "protocol"
MUTATORS = {"pop", "popitem", "clear", "add", "discard", "remove", "append", "extend", "insert", "setdefault",
            "update", "sort", "reverse", "difference_update", "intersection_update", "symmetric_difference_update"}
COUNT_MUTATORS = {"add_one", "take_one"}  # state.py's unit arithmetic: mutates its first argument
COMPOSITE = "composite"  # the machine object itself (its plain fields belong to node.py)


@dataclass(frozen=True)
class Package:
    """A package of modules, its composite class (in node.py) and who owns what."""

    classes: dict[str, str]  # class name -> the module defining it
    fields: dict[str, str]  # composite field -> the module that owns the object it holds ("node" for plain ones)
    composite: str
    mixins: frozenset[str]


def _annotation_name(ann: ast.expr | None) -> str | None:
    if isinstance(ann, ast.Name):
        return ann.id
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):  # `C | None`
        return _annotation_name(ann.left) or _annotation_name(ann.right)
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        return ann.value.split("|")[0].strip()
    return None


def package_of(sources: dict[str, str], composite: str) -> Package:
    """Ownership in a package given as {module name: source}: the state classes and the composite's fields."""
    trees = {m: ast.parse(s) for m, s in sources.items()}
    classes = {n.name: m for m, t in trees.items() for n in t.body if isinstance(n, ast.ClassDef)}
    fields: dict[str, str] = {}
    mixins: set[str] = set()
    for node in trees["node"].body:
        if not (isinstance(node, ast.ClassDef) and node.name == composite):
            continue
        mixins = {b.id for b in node.bases if isinstance(b, ast.Name) and b.id in classes}
        for f in ast.walk(node):
            targets = f.targets if isinstance(f, ast.Assign) else [f.target] if isinstance(f, ast.AnnAssign) else []
            ann = _annotation_name(f.annotation) if isinstance(f, ast.AnnAssign) else None
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    fields.setdefault(t.attr, classes.get(ann or "") or _constructed_by(f.value, classes) or "node")
    return Package(classes, fields, composite, frozenset(mixins))


def _constructed_by(value: ast.expr | None, classes: dict[str, str]) -> str | None:
    """The module of the state class `value` builds (`C(...)` or `C.of(...)`), if any."""
    if isinstance(value, ast.Call):
        f = value.func
        if isinstance(f, ast.Attribute):
            f = f.value
        if isinstance(f, ast.Name) and f.id in classes:
            return classes[f.id]
    return None


class _Checker(ast.NodeVisitor):
    def __init__(self, pkg: Package, module: str) -> None:
        self.pkg, self.module = pkg, module
        self.cls: str | None = None
        self.scope: dict[str, str] = {}  # name -> COMPOSITE or the owning module
        self.errors: list[str] = []

    # -- scopes
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer, self.cls = self.cls, node.name
        self.generic_visit(node)
        self.cls = outer

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer = self.scope
        self.scope = dict(outer)
        args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        for i, a in enumerate(args):
            ann = _annotation_name(a.annotation)
            if i == 0 and a.arg == "self" and self.cls is not None:
                if self.cls == self.pkg.composite or self.cls in self.pkg.mixins:
                    self.scope["self"] = COMPOSITE
                else:
                    self.scope["self"] = self.pkg.classes.get(self.cls, self.module)
            elif ann == self.pkg.composite:
                self.scope[a.arg] = COMPOSITE
            elif ann in self.pkg.classes:
                self.scope[a.arg] = self.pkg.classes[ann]
            else:
                self.scope.pop(a.arg, None)
        self.generic_visit(node)
        self.scope = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    # -- what an expression is part of
    def owner(self, expr: ast.expr) -> str | None:
        """The module owning the object `expr` lies in (None: not a tracked object)."""
        path: list[str] = []
        while True:
            if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
                expr = expr.func.value  # `x.get(k)`, `x.setdefault(k, v)`: part of x
            elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "next" \
                    and expr.args:
                expr = expr.args[0]
            elif isinstance(expr, ast.Attribute):
                path.append(expr.attr)
                expr = expr.value
            elif isinstance(expr, ast.Subscript):
                expr = expr.value
            else:
                break
        if not isinstance(expr, ast.Name) or expr.id not in self.scope:
            return None
        root = self.scope[expr.id]
        if root != COMPOSITE:
            return root
        if not path:
            return COMPOSITE
        return self.pkg.fields.get(path[-1], "node")

    def bind(self, target: ast.expr, value: ast.expr | None) -> None:
        if isinstance(target, ast.Name):
            who = self.owner(value) if value is not None else None
            if who is None or who == COMPOSITE and not isinstance(value, ast.Name):
                self.scope.pop(target.id, None)
            else:
                self.scope[target.id] = who
        elif isinstance(target, (ast.Tuple, ast.List)):
            vals = value.elts if isinstance(value, (ast.Tuple, ast.List)) and \
                len(value.elts) == len(target.elts) else [None] * len(target.elts)
            for t, v in zip(target.elts, vals):
                self.bind(t, v)

    # -- writes
    def written(self, target: ast.expr, line: int) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.written(t, line)
            return
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return
        if isinstance(target, ast.Attribute) and self.owner(target.value) == COMPOSITE:
            who = "node"  # a field of the composite itself (binding a state object to it is composing)
        else:
            who = self.owner(target)
        if who is not None and who != self.module:
            self.errors.append(f"{self.module}.py:{line}: {ast.unparse(target)} belongs to {who}.py")

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for t in node.targets:
            self.written(t, node.lineno)
        for t in node.targets:
            self.bind(t, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        self.written(node.target, node.lineno)
        ann = _annotation_name(node.annotation)
        if isinstance(node.target, ast.Name) and ann in self.pkg.classes:
            self.scope[node.target.id] = self.pkg.classes[ann]  # `r: RelayRecord | None = self.mbs.get(key)`
        else:
            self.bind(node.target, node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.generic_visit(node)
        self.written(node.target, node.lineno)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.generic_visit(node)
        self.bind(node.target, node.value)

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self.bind(node.target, node.iter)  # an item of a tracked container is part of it
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    def visit_Delete(self, node: ast.Delete) -> None:
        self.generic_visit(node)
        for t in node.targets:
            self.written(t, node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in MUTATORS:
            self.written(ast.Subscript(f.value, ast.Constant(0)), node.lineno)
        elif isinstance(f, ast.Name) and f.id in COUNT_MUTATORS and node.args:
            self.written(ast.Subscript(node.args[0], ast.Constant(0)), node.lineno)


def violations(sources: dict[str, str], composite: str) -> list[str]:
    pkg = package_of(sources, composite)
    out: list[str] = []
    for module, src in sorted(sources.items()):
        c = _Checker(pkg, module)
        c.visit(ast.parse(src))
        out += c.errors
    return out


def sources(package: str) -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted((ROOT / package).glob("*.py")) if p.stem != "__init__"}


def test_flow_modules_write_only_their_own_state():
    assert violations(sources("flow"), "FlowNode") == []


def test_recovery_modules_write_only_their_own_state():
    # (a microbatch's record is written by the side that holds it: a relay's by relay.py, a data node's by
    # data.py, its rounds' part, `RoundState`, by rounds.py)
    src = sources("recovery")
    pkg = package_of(src, "RecoveryNode")
    assert not pkg.mixins
    assert {f: pkg.fields[f] for f in ("peers", "routing", "relay", "data", "rounds", "cfg")} == {
        "peers": "neighbours", "routing": "routing", "relay": "relay", "data": "data", "rounds": "rounds",
        "cfg": "node"}
    assert {c: pkg.classes[c] for c in ("RelayRecord", "DataRecord", "RoundState")} == {
        "RelayRecord": "relay", "DataRecord": "data", "RoundState": "rounds"}
    assert violations(src, "RecoveryNode") == []


def test_the_check_sees_writes_into_another_recovery_modules_state():
    src = sources("recovery")
    bad = {
        "rounds": "def f(node: RecoveryNode, m: DataRecord):\n    m.rest = ()\n    node.data.waiting.pop(0)\n",
        "data": "def f(node: RecoveryNode):\n    node.relay.contrib.clear()\n    node.cfg = None\n",
        "neighbours": "def f(node: RecoveryNode):\n    for r in node.relay.records.values():\n        r.parked = True\n",
        "relay": "def f(node: RecoveryNode, m: DataRecord):\n    rs = m.round\n    rs.count += 1\n"
                 "    node.peers.dead.add('x')\n",
        "routing": "def f(node: RecoveryNode):\n    node.data.records[None] = 1\n",
    }
    found = violations({**src, **{m: src[m] + "\n\n" + s for m, s in bad.items()}}, "RecoveryNode")
    assert len(found) == 8, found
    assert any("rounds.py" in e and "data.py" in e for e in found)
    ok = "def g(node: RecoveryNode, m: DataRecord):\n    m.rest = ()\n    node.data.waiting.pop(0)\n"
    assert violations({**src, "data": src["data"] + "\n\n" + ok}, "RecoveryNode") == []


def test_the_check_sees_writes_into_another_modules_state():
    src = sources("flow")
    assert set(package_of(src, "FlowNode").fields) >= {"labels", "units", "wave", "cfg"}
    bad = {
        "units": "def f(node: FlowNode):\n    node.labels.lin['d']['j'] = None\n",  # another module's object
        "moves": "def f(node: FlowNode):\n    w = node.wave.walk.setdefault('d', [])\n    w.append(1)\n",  # alias
        "bids": "def f(node: FlowNode):\n    node.cfg = None\n    node.units.pending.pop(1)\n",  # node.py's field
        "waves": "def f(u: UnitState):\n    u.grace_until += 1\n    take_one(u.inn['d'], 'p')\n",  # by annotation
        "labels": "def f(node: FlowNode):\n    for x in node.units.pending.values():\n        x.peer = 'q'\n",
    }
    found = violations({**src, **{m: src[m] + "\n\n" + s for m, s in bad.items()}}, "FlowNode")
    assert len(found) == 8, found
    assert any("labels.py" in e and "units.py" in e for e in found)
    # its own object is fine
    ok = "def g(node: FlowNode):\n    node.units.pending.pop(1)\n    u = node.units\n    u.grace_until = 2\n"
    assert violations({**src, "units": src["units"] + "\n\n" + ok}, "FlowNode") == []
