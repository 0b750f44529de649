"""The documentation names what exists: repository paths, `gwtf-node` subcommands and their flags.

README.md and docs/*.md name files of the repository (`gwtf_node/runtime/node/node.py`,
`scripts/bench_flow.py`, `docs/network.md`, ...) in backticks, in links and in
prose.  Every such name that starts at a top-level directory of the repository
(`gwtf_node/`, `scripts/`, `tests/`, `docs/`, `protos/`, `docker/`), or at a
package of `gwtf_node/` (`runtime/`, `protocol/`, `model/`, `sim/`, `cli/`,
`testing/`: the short form the pages use after naming the package) must exist;
a name with `*` must match at least one file, and a dotted name
(`protocol/membership.place`) must be a module that defines it.  A bare
source file name (`node.py`, `build_image.sh`) must be the name of some file
of the repository, and every relative link (`[network.md](network.md)`, an
image) must lead to a file.  Every `gwtf-node <subcommand>` in a code span
or a code block must be a subcommand of the command line's parser (and, for
`sim` and `config`, its second word one of theirs), and every `--flag` on a
code line of such a command must be one that parser takes.  The parser is
built, never run: nothing here starts a process.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from support.helpers import ROOT

from gwtf_node.cli import build_parser

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("gwtf_node", "scripts", "tests", "docs", "protos", "docker")
SHORT = ("runtime", "protocol", "model", "sim", "cli", "testing")  # packages of gwtf_node/, named on their own
PATH_RE = re.compile(rf"(?<![\w./~$-])((?:{'|'.join(TOP + SHORT)})/[\w.*/-]*)")
BARE_RE = re.compile(r"(?<![\w./~$-])([\w-]+\.(?:py|sh))\b")
CODE_SPAN_RE = re.compile(r"`([^`\n]+)`")
FENCE_RE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
COMMAND_RE = re.compile(r"(?<![\w.-])gwtf-node[ \t]+([a-z][a-z-]*)(?:[ \t]+([a-z][a-z-]*))?")
LINK_RE = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def named_paths(text: str) -> set[str]:
    """Every repository path a page names (trailing sentence punctuation left off)."""
    out = set()
    for mo in PATH_RE.finditer(text):
        p = mo.group(1).rstrip(".,;:")
        if p.count("/") == 1 and p.endswith("/") and p[:-1] in SHORT:
            out.add(p)  # `runtime/` alone: the package itself
        elif p.rstrip("/") not in TOP + SHORT:
            out.add(p)
    return out


def resolve(p: str) -> list[Path]:
    """The files or directories a named path stands for (empty: it names nothing that exists)."""
    base = ROOT if p.split("/", 1)[0] in TOP else ROOT / "gwtf_node"
    if "*" in p:
        return sorted(base.glob(p))
    target = base / p
    if target.exists() and (not p.endswith("/") or target.is_dir()):
        return [target]
    module, _, attr = p.rpartition(".")  # protocol/membership.place: `place` of protocol/membership.py
    source = base / f"{module}.py"
    if module and attr.isidentifier() and source.is_file() and re.search(
            rf"^(?:def|class|async def) {attr}\b|^{attr}\b.*=", source.read_text(), re.M):
        return [source]
    return []


def _source_names() -> set[str]:
    skip = {".git", ".venv", ".venv-ci", "node_modules"}
    return {p.name for d in TOP for p in (ROOT / d).rglob("*") if not skip & set(p.parts)}


SOURCE_NAMES = _source_names()
OTHER_REPOSITORIES = {"balanced_expert.py"}  # yandex-research/swarm's, named where SWARM's baseline is compared


def unknown_bare_names(text: str) -> set[str]:
    """Bare source file names (`node.py`) that no file of the repository has."""
    return {n for n in BARE_RE.findall(text) if n not in SOURCE_NAMES | OTHER_REPOSITORIES}


def code_texts(text: str) -> list[str]:
    """The page's code: each fenced block's lines and each inline code span, one string per line."""
    lines = [line for block in FENCE_RE.findall(text) for line in block.splitlines()]
    outside = FENCE_RE.sub("", text)
    return lines + CODE_SPAN_RE.findall(outside)


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


PARSER = build_parser()
COMMANDS = _subparsers(PARSER)


def command_problems(line: str) -> list[str]:
    """What is wrong with the `gwtf-node` commands of one code line: unknown subcommands and flags."""
    problems = []
    for mo in COMMAND_RE.finditer(line):
        sub, second = mo.group(1), mo.group(2)
        if sub not in COMMANDS:
            problems.append(f"`gwtf-node {sub}`: no such subcommand (known: {', '.join(sorted(COMMANDS))})")
            continue
        parser = COMMANDS[sub]
        nested = _subparsers(parser)
        if nested:
            if second is None:
                continue
            if second not in nested:
                problems.append(f"`gwtf-node {sub} {second}`: no such subcommand of {sub}")
                continue
            parser = nested[second]
        # the flags of this command: up to a comment, a pipe, a redirection or the next command
        rest = re.split(r"\s#|&&|\|\||[|>;]|(?<![\w.-])gwtf-node[ \t]", line[mo.end():])[0]
        known = _flags(parser)
        if sub == "install-service":  # it passes the flags of join through to the unit
            known |= _flags(COMMANDS["join"])
        problems += [f"`gwtf-node {sub}{' ' + second if nested else ''} {f}`: no such flag"
                     for f in FLAG_RE.findall(rest) if f not in known]
    return problems


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_named_paths_exist(page: Path) -> None:
    missing = sorted(p for p in named_paths(page.read_text()) if not resolve(p))
    assert not missing, f"{_rel(page)} names paths that do not exist: {missing}"


def broken_links(page: Path, text: str) -> list[str]:
    """Relative link targets of a page (its links and images) that lead to no file."""
    return [t for t in LINK_RE.findall(text) if "://" not in t and not t.startswith("mailto:")
            and not (page.parent / t).exists()]


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_links_lead_somewhere(page: Path) -> None:
    broken = broken_links(page, page.read_text())
    assert not broken, f"{_rel(page)} links to what does not exist: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_bare_file_names_exist(page: Path) -> None:
    unknown = sorted(unknown_bare_names(page.read_text()))
    assert not unknown, f"{_rel(page)} names source files no file of the repository is called: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_commands_are_real(page: Path) -> None:
    text = page.read_text()
    problems = [p for line in code_texts(text) for p in command_problems(line)]
    assert not problems, f"{_rel(page)}:\n" + "\n".join(problems)


def test_the_checks_can_fail() -> None:
    """The rules catch what they are for: a missing file, an unknown subcommand, an unknown flag."""
    assert named_paths("see `gwtf_node/runtime/nope.py` and scripts/bench_flow.py.") == {
        "gwtf_node/runtime/nope.py", "scripts/bench_flow.py"}
    assert not resolve("gwtf_node/runtime/nope.py") and resolve("scripts/bench_flow.py")
    assert resolve("runtime/node/node.py") and not resolve("protocol/recovery.py") and resolve("protocol/recovery/")
    assert resolve("docs/bench_*.md") and not resolve("docs/nothing_*.md")
    assert resolve("protocol/membership.place") and not resolve("protocol/membership.no_such_function")
    assert unknown_bare_names("`cli.py` and `node.py`, `scripts/build_image.sh`") == {"cli.py"}
    assert broken_links(ROOT / "docs" / "x.md", "[a](network.md) [b](../README.md#x) [c](nope.md) [d](https://e)") == [
        "nope.md"]
    assert command_problems("gwtf-node frobnicate --x")
    assert command_problems("gwtf-node sim nothing")
    assert command_problems("gwtf-node join --run run.json --no-such-flag")
    assert not command_problems("gwtf-node join --run run.json --role relay  # a comment --not-a-flag")
    assert not command_problems("gwtf-node init-run --out r.json && gwtf-node local --run r.json --iterations 3")
    assert code_texts("a `gwtf-node x` b\n```bash\ngwtf-node y\n```\n") == ["gwtf-node y", "gwtf-node x"]
