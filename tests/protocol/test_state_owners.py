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

It follows attribute chains into records: a field whose annotation (or
constructor) names a state class holds an object of that class, and a
container annotated with one (`dict[Key, DataRecord]`, `list[C]`) holds
objects of it, reached by subscripts, `get` / `pop` / `setdefault`, loops
(also over `.values()` / `.items()`) and list comprehensions that keep the
items.  So `m.round.count += 1` in data.py, with `m: DataRecord`, writes the
`RoundState` that rounds.py owns, and fails; `m.round = RoundState()` writes
the `DataRecord` (data.py's) and passes: a write belongs to the owner of the
object whose field or item it replaces.
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
    types: dict[str, dict[str, Kind]]  # class -> its fields that hold a state object, or a container of them


Kind = tuple[int, str]  # (depth, class): depth 0 is an object of the class, n > 0 a container n levels above one
CONTAINERS = {"dict", "Dict", "Mapping", "MutableMapping", "defaultdict", "OrderedDict", "list", "List", "set",
              "Set", "frozenset", "FrozenSet", "deque", "Sequence", "Iterable", "tuple", "Tuple"}
ITEM_METHODS = {"get", "setdefault", "pop"}  # `x.get(k)`: an item of the container x
VIEWS = {"values", "keys", "items"}  # `x.values()`: the container x itself, seen from a loop


def _annotation_name(ann: ast.expr | None) -> str | None:
    if isinstance(ann, ast.Name):
        return ann.id
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):  # `C | None`
        return _annotation_name(ann.left) or _annotation_name(ann.right)
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        return ann.value.split("|")[0].strip()
    return None


def _kind_of(ann: ast.expr | None, classes: dict[str, str]) -> Kind | None:
    """What an annotation holds: a state class (`C`, `C | None`, `"C"`) or a container of one (`dict[K, C]`,
    `list[C]`, nested)."""
    if isinstance(ann, ast.Name):
        return (0, ann.id) if ann.id in classes else None
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        return _kind_of(ann.left, classes) or _kind_of(ann.right, classes)
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        try:
            return _kind_of(ast.parse(ann.value, mode="eval").body, classes)
        except SyntaxError:
            return None
    if isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id in CONTAINERS:
        args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        inner = _kind_of(args[-1], classes) if args else None  # (a mapping's values; a tuple's last part)
        return (inner[0] + 1, inner[1]) if inner is not None else None
    return None


def _types_of(cls: ast.ClassDef, classes: dict[str, str]) -> dict[str, Kind]:
    """The fields of class `cls` holding state objects: its annotated class-body fields (a dataclass) and what
    its methods bind to `self.x` with an annotation or a state class's constructor."""
    out: dict[str, Kind] = {}
    for f in cls.body:
        if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name):
            k = _kind_of(f.annotation, classes)
            if k is not None:
                out[f.target.id] = k
    for f in ast.walk(cls):
        targets = f.targets if isinstance(f, ast.Assign) else [f.target] if isinstance(f, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                k = _kind_of(f.annotation, classes) if isinstance(f, ast.AnnAssign) else None
                built = _constructed_by(f.value, classes, name=True)
                k = k or ((0, built) if built else None)
                if k is not None:
                    out.setdefault(t.attr, k)
    return out


def package_of(sources: dict[str, str], composite: str) -> Package:
    """Ownership in a package given as {module name: source}: the state classes and the composite's fields."""
    trees = {m: ast.parse(s) for m, s in sources.items()}
    classes = {n.name: m for m, t in trees.items() for n in t.body if isinstance(n, ast.ClassDef)}
    types = {n.name: _types_of(n, classes) for t in trees.values() for n in t.body if isinstance(n, ast.ClassDef)}
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
    return Package(classes, fields, composite, frozenset(mixins), types)


def _constructed_by(value: ast.expr | None, classes: dict[str, str], name: bool = False) -> str | None:
    """The module of the state class `value` builds (`C(...)` or `C.of(...)`), if any (`name`: the class)."""
    if isinstance(value, ast.Call):
        f = value.func
        if isinstance(f, ast.Attribute):
            f = f.value
        if isinstance(f, ast.Name) and f.id in classes:
            return f.id if name else classes[f.id]
    return None


Ref = tuple[str, "Kind | None"]  # what an expression is part of: its owning module (or COMPOSITE), what it holds
ITEM = ""  # a step into an item of a container (`x[k]`, `x.get(k)`, `x.values()`, an element of a loop)


class _Checker(ast.NodeVisitor):
    def __init__(self, pkg: Package, module: str) -> None:
        self.pkg, self.module = pkg, module
        self.cls: str | None = None
        self.scope: dict[str, Ref] = {}  # name -> what it is part of
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
                    self.scope["self"] = (COMPOSITE, (0, self.pkg.composite))
                else:
                    self.scope["self"] = (self.pkg.classes.get(self.cls, self.module), (0, self.cls))
            elif ann == self.pkg.composite:
                self.scope[a.arg] = (COMPOSITE, (0, self.pkg.composite))
            elif (kind := _kind_of(a.annotation, self.pkg.classes)) is not None:
                self.scope[a.arg] = (self.pkg.classes[kind[1]] if kind[0] == 0 else self.module, kind)
            else:
                self.scope.pop(a.arg, None)
        self.generic_visit(node)
        self.scope = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    # -- what an expression is part of
    def ref(self, expr: ast.expr | None) -> Ref | None:
        """The object `expr` lies in, followed from a tracked name through fields into records: a field
        holding a state object belongs to that object's class's module, a container's items to their class's
        (None: not a tracked object)."""
        steps: list[str] = []  # outermost first
        while expr is not None:
            if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
                # `x.get(k)`, `x.setdefault(k, v)`: part of x (an item of x for ITEM_METHODS)
                if expr.func.attr not in VIEWS:
                    steps.append(ITEM if expr.func.attr in ITEM_METHODS else "()")
                expr = expr.func.value
            elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "next" \
                    and expr.args:
                steps.append(ITEM)
                expr = expr.args[0]
            elif isinstance(expr, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and len(expr.generators) == 1 \
                    and isinstance(expr.elt, ast.Name) and isinstance(expr.generators[0].target, ast.Name) \
                    and expr.elt.id == expr.generators[0].target.id:
                steps.append("[]")  # `[m for m in x if ...]`: the items of x, in a new list
                expr = expr.generators[0].iter
            elif isinstance(expr, ast.Attribute):
                steps.append(expr.attr)
                expr = expr.value
            elif isinstance(expr, ast.Subscript):
                steps.append(ITEM)
                expr = expr.value
            else:
                break
        if not isinstance(expr, ast.Name) or expr.id not in self.scope:
            return None
        who, kind = self.scope[expr.id]
        for step in reversed(steps):
            if step == "[]":  # a new list of the items: it holds what an item is
                kind = None if kind is None or kind[0] == 0 else kind
                continue
            if step == "()":
                kind = None
                continue
            if step == ITEM:
                if kind is not None and kind[0] > 0:
                    kind = (kind[0] - 1, kind[1])
                    if kind[0] == 0:
                        who = self.pkg.classes[kind[1]]
                else:
                    kind = None
                continue
            if who == COMPOSITE and kind is not None and kind == (0, self.pkg.composite):
                who = self.pkg.fields.get(step, "node")
                kind = self.pkg.types.get(self.pkg.composite, {}).get(step)
            elif kind is not None and kind[0] == 0:
                kind = self.pkg.types.get(kind[1], {}).get(step)
            else:
                kind = None
            if kind is not None and kind[0] == 0:
                who = self.pkg.classes[kind[1]]
        return who, kind

    def owner(self, expr: ast.expr | None) -> str | None:
        """The module owning the object `expr` lies in (COMPOSITE: the composite itself; None: not tracked)."""
        r = self.ref(expr)
        if r is None:
            return None
        if r[0] == COMPOSITE and isinstance(expr, ast.Name):
            return COMPOSITE
        return "node" if r[0] == COMPOSITE else r[0]

    def bind(self, target: ast.expr, value: ast.expr | None, item: bool = False) -> None:
        if isinstance(target, ast.Name):
            if value is not None and item:
                value = ast.Subscript(value, ast.Constant(0))  # an item of a loop's container
            r = self.ref(value) if value is not None else None
            if r is None or r[0] == COMPOSITE and not isinstance(value, ast.Name):
                self.scope.pop(target.id, None)
            else:
                self.scope[target.id] = r
        elif isinstance(target, (ast.Tuple, ast.List)):
            vals = value.elts if isinstance(value, (ast.Tuple, ast.List)) and \
                len(value.elts) == len(target.elts) else [None] * len(target.elts)
            for t, v in zip(target.elts, vals):
                self.bind(t, v)

    # -- writes
    def written(self, target: ast.expr, line: int) -> None:
        """A write into the object holding `target`: `a.b.c = v` writes the object `a.b` (the owner of `b`'s
        record when `b` holds one), `x[k] = v` the container x."""
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.written(t, line)
            return
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return
        r = self.ref(target.value)
        if r is None:
            return
        who = "node" if r[0] == COMPOSITE else r[0]  # (a field of the composite: binding a state object to it
        if who != self.module:                      #  is composing, node.py's)
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
        kind = _kind_of(node.annotation, self.pkg.classes)
        if isinstance(node.target, ast.Name) and kind is not None and kind[0] == 0:
            self.scope[node.target.id] = (self.pkg.classes[kind[1]], kind)  # `r: RelayRecord | None = ...get(k)`
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
        self.bind(node.target, node.iter, item=True)  # an item of a tracked container is part of it
        it = node.iter
        if isinstance(node.target, ast.Tuple) and len(node.target.elts) == 2 and isinstance(it, ast.Call) \
                and isinstance(it.func, ast.Attribute) and it.func.attr == "items":
            self.bind(node.target.elts[1], it, item=True)  # `for k, v in x.items()`: v is an item of x
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


def test_the_check_follows_fields_into_records():
    # a record's field holding another module's record (`DataRecord.round: RoundState`), reached through a
    # parameter, a container of the composite's part, a loop, a comprehension and `.items()`
    src = sources("recovery")
    pkg = package_of(src, "RecoveryNode")
    assert pkg.types["DataRecord"]["round"] == (0, "RoundState")
    assert pkg.types["DataSide"]["records"] == (1, "DataRecord")
    bad = {
        "data": "def f(node: RecoveryNode, m: DataRecord):\n    m.round.count += 1\n"
                "    for mm in node.data.records.values():\n        mm.round.snapshot.clear()\n",
        "relay": "def f(node: RecoveryNode, k):\n    node.data.records[k].round.collecting = True\n"
                 "    xs = [m for m in node.data.records.values() if m.parked]\n    xs[0].round.count = 2\n"
                 "    for _, m in node.data.records.items():\n        m.round.count = 3\n",
    }
    found = violations({**src, **{m: src[m] + "\n\n" + s for m, s in bad.items()}}, "RecoveryNode")
    assert len(found) == 5, found
    assert all(e.endswith("belongs to rounds.py") for e in found), found
    # the holder's own field, and rounds.py writing its record through the holder, are fine
    ok = {"data": "def g(m: DataRecord):\n    m.round = RoundState()\n    m.rest = ()\n",
          "rounds": "def g(node: RecoveryNode, k):\n    node.data.records[k].round.count += 1\n"}
    assert violations({**src, **{m: src[m] + "\n\n" + s for m, s in ok.items()}}, "RecoveryNode") == []
