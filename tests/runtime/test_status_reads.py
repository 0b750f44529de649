"""The status reads the components through their `status()` snapshots only (runtime/node/snapshots.py).

Static checks on the sources: in status.py, every use of a component that
the status is handed (`StatusSources.liveness`, `.stage`, `.flows`,
`.microbatches`, `.aggregation`, `.leadership`) is the call
`<sources>.<component>.status()`, where `<sources>` is `self.src` or a local
name bound to it; each of those components defines `status()` returning a
frozen dataclass of snapshots.py; and a snapshot's fields hold plain data
(builtin types and other snapshots), never a component or its records.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest

from gwtf_node.runtime.node import snapshots
from gwtf_node.runtime.node.aggregation import Aggregation
from gwtf_node.runtime.node.flows import Flows
from gwtf_node.runtime.node.leadership import Leadership
from gwtf_node.runtime.node.liveness import Liveness
from gwtf_node.runtime.node.microbatches import Microbatches
from gwtf_node.runtime.node.stage import LocalStage
from gwtf_node.runtime.node.status import Status, StatusSources

STATUS = Path(__file__).resolve().parents[2] / "gwtf_node" / "runtime" / "node" / "status.py"
COMPONENTS = {"liveness": Liveness, "stage": LocalStage, "flows": Flows, "microbatches": Microbatches,
              "aggregation": Aggregation, "leadership": Leadership}
PLAIN = {"str", "int", "float", "bool", "None", "dict", "tuple", "frozenset", "list", "..."}


def _is_sources(expr: ast.expr, aliases: set[str]) -> bool:
    """`self.src`, or a name bound to it (or a parameter annotated `StatusSources`)."""
    if isinstance(expr, ast.Attribute) and expr.attr == "src" and isinstance(expr.value, ast.Name) \
            and expr.value.id == "self":
        return True
    return isinstance(expr, ast.Name) and expr.id in aliases


def a_name(arg: ast.arg) -> str | None:
    ann = arg.annotation
    return ann.id if isinstance(ann, ast.Name) else ann.value if isinstance(ann, ast.Constant) else None


def component_reads(source: str) -> list[str]:
    """Each read of a component in `source` other than `<sources>.<component>.status()`, as 'line: code'."""
    tree = ast.parse(source)
    aliases = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _is_sources(n.value, set())
               for t in n.targets if isinstance(t, ast.Name)}
    aliases |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg) and a_name(n) == "StatusSources"}
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    bad = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Attribute) and n.attr in COMPONENTS and _is_sources(n.value, aliases)):
            continue
        up = parents.get(n)
        call = parents.get(up)
        ok = isinstance(up, ast.Attribute) and up.attr == "status" and isinstance(call, ast.Call) \
            and call.func is up and not call.args and not call.keywords
        if not ok:
            bad.append(f"{n.lineno}: {ast.unparse(up if isinstance(up, ast.expr) else n)}")
    # the sources object itself handed on (a component then read elsewhere) is a read too
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            for a in n.args + [k.value for k in n.keywords]:
                if _is_sources(a, aliases):
                    bad.append(f"{n.lineno}: {ast.unparse(n)}")
    return bad


def test_status_reads_components_only_through_their_snapshots():
    assert component_reads(STATUS.read_text()) == []


def test_the_check_sees_a_components_field_read():
    src = STATUS.read_text()
    planted = {
        "self.src.flows.prev_costs": "    def f(self):\n        return self.src.flows.prev_costs\n",
        "s.liveness.crashed": "    def f(self):\n        s = self.src\n        return s.liveness.crashed\n",
        "self.src.leadership.leader": "    def f(self):\n        return self.src.leadership.leader()\n",
        "self.src.stage": "    def f(self):\n        st = self.src.stage\n        return st.status()\n",
        "helper(self.src)": "    def f(self):\n        return helper(self.src)\n",
        "sources.flows": "    def f(self, sources: StatusSources):\n        return sources.flows.out()\n",
    }
    anchor = "    def snapshot(self) -> dict:\n"
    assert anchor in src
    for what, method in planted.items():
        found = component_reads(src.replace(anchor, method + "\n" + anchor))
        assert len(found) == 1 and what in found[0], (what, found)


def test_every_component_hands_out_a_frozen_snapshot_of_plain_data():
    frozen = {name for name, c in vars(snapshots).items() if dataclasses.is_dataclass(c) and isinstance(c, type)}
    for name, cls in COMPONENTS.items():
        ret = typing.get_type_hints(cls.status)["return"]
        assert ret.__name__ in frozen, (name, ret)
    for name in frozen:
        c = getattr(snapshots, name)
        assert c.__dataclass_params__.frozen, name
        for f in dataclasses.fields(c):  # plain types and other snapshots only: nothing of a component's
            words = set(f.type.translate(str.maketrans("[],|", "    ")).split())
            assert words <= PLAIN | frozen, (name, f.name, f.type)


def test_the_status_is_built_from_few_parts():
    params = list(inspect.signature(Status.__init__).parameters)
    assert params == ["self", "path", "sources", "run"]
    assert set(COMPONENTS) <= {f.name for f in dataclasses.fields(StatusSources)}


def test_a_slow_status_round_waits_longer_so_that_it_takes_a_bounded_share_of_the_loop() -> None:
    from gwtf_node.runtime.node import status

    assert status.round_wait_s(0.0) == status.STATUS_EVERY_S == 1.0
    assert status.round_wait_s(0.015) == 1.0  # a small node: every second, as ever
    assert status.round_wait_s(0.04) == pytest.approx(2.0)  # 40 ms a round: every 2 s, 2 % of the loop
    assert 0.5 / (status.round_wait_s(0.5) + 0.5) < 0.021  # a 0.5-s round: 2 % of the loop still
