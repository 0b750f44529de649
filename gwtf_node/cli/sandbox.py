"""What the service's sandbox would hide from it, and the unit lines that let it read those paths.

The unit of `install-service` runs with `ProtectHome=` and `PrivateTmp=yes`
(service.py): /home, /root and /run/user are invisible to it, and /tmp and
/var/tmp are fresh empty directories.  A volunteer who follows the README has
the virtual environment under the home directory (and pyenv's interpreter, which
a venv's `python` links to, under ~/.pyenv), and a manifest downloaded to /tmp:
none of it is there for the service.  So the installer lists every path the
node reads at start-up (`needed_paths`):

* the interpreter and its installation: the venv (`sys.prefix`), the base
  installation (`sys.base_prefix`, and the directory the real interpreter
  resolves into), and the package's source tree for an editable install; with
  `--exec`, the installation its executable resolves into;
* the run manifest and the files it names that this role opens (weights, a
  tokenizer, and for a data node its data files), relative names resolved
  against the manifest's directory as the node resolves them;
* the files of the `join` flags `--links`, `--restore` and `--revocations`.

A path hidden by either setting (`hidden_by`) is bound read-only at the same
place (`BindReadOnlyPaths=`): the node sees the same paths it was installed
with, so a manifest's relative names still resolve.  With anything under a
home directory, `ProtectHome=tmpfs` replaces `ProtectHome=yes` (an empty
tmpfs over the homes, with the bound paths on it; systemd's documented way to
expose part of a home).  Binding under a private /tmp works the same way.

The dynamic user of the unit is nobody's account: it reads a bound path only
where "others" may (`unreadable`): a directory on the way that is not
world-searchable, or a file that is not world-readable, is refused at install
with the `chmod` that fixes it.  The certificate and the identity key are not
bound: they live in the service's own state directory (service.py).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Iterable

HOME_PREFIXES = ("/home/", "/root/", "/run/user/")  # ProtectHome=yes hides these
TMP_PREFIXES = ("/tmp/", "/var/tmp/")  # PrivateTmp=yes replaces these


def hidden_by(path: str | Path) -> str | None:
    """"ProtectHome" or "PrivateTmp" when the unit's sandbox hides `path`, else None."""
    p = str(path).rstrip("/") + "/"
    if p.startswith(HOME_PREFIXES) or p in ("/home/", "/root/"):
        return "ProtectHome"
    if p.startswith(TMP_PREFIXES):
        return "PrivateTmp"
    return None


def installation_paths(exec_argv: list[str], default_exec: bool) -> list[Path]:
    """Where the interpreter and the package that `exec_argv` starts live (module doc)."""
    if not default_exec:
        real = Path(os.path.realpath(exec_argv[0]))
        return [real.parent.parent]  # bin/gwtf-node -> the installation (a venv or a prefix)
    import gwtf_node

    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent]
    source = Path(gwtf_node.__file__).resolve().parent.parent  # an editable install's tree, else site-packages
    paths.append(source)
    return paths


def manifest_paths(man, run: Path, role: str) -> list[Path]:
    """The manifest and the files it names that a node of `role` opens."""
    out = [run]
    named: list[str] = []
    if man.model.weights:
        named.append(man.model.weights)
    if role == "data":
        tok = man.data.tokenizer
        if tok and tok != "bytes":
            named.append(tok)
        src = man.data.source
        named.extend([src] if isinstance(src, str) else list(src))
    for n in named:
        if n == "bundled":
            continue
        p = Path(n)
        out.append(p if p.is_absolute() else (run.parent / p))
    weights = man.model.weights
    if weights and str(weights).endswith(".index.json"):  # a sharded checkpoint: its shards sit beside the index
        p = Path(weights)
        out.append((p if p.is_absolute() else run.parent / p).parent)
    return out


def needed_paths(exec_argv: list[str], default_exec: bool, man, run: Path, role: str,
                 flag_files: Iterable[str | None]) -> list[Path]:
    """Every path the service reads at start-up, absolute, in a stable order, without duplicates."""
    paths = [*installation_paths(exec_argv, default_exec), *manifest_paths(man, run, role)]
    paths += [Path(f) for f in flag_files if f]
    seen: dict[str, Path] = {}
    for p in paths:
        a = Path(os.path.abspath(p))
        seen.setdefault(str(a), a)
    return list(seen.values())


def binds(paths: Iterable[Path]) -> list[Path]:
    """The hidden ones among `paths`, without those inside another one kept."""
    hidden = sorted({Path(os.path.abspath(p)) for p in paths if hidden_by(p)}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for p in hidden:
        if not any(p == k or k in p.parents for k in kept):
            kept.append(p)
    return sorted(kept)


def unreadable(path: Path, bound: list[Path]) -> str | None:
    """Why the unit's dynamic user (neither owner nor group) cannot read `path`, with the `chmod` that fixes it;
    None when it can.  Under a bound path only the bound directory and what is below it count: the sandbox makes
    the directories above it itself (a tmpfs over the homes, a private /tmp)."""
    p = Path(os.path.abspath(path))
    top = next((b for b in bound if b == p or b in p.parents), None)
    chain = [d for d in reversed(p.parents) if top is None or d == top or top in d.parents]
    try:
        for d in chain:
            if str(d) != "/" and not os.stat(d).st_mode & stat.S_IXOTH:
                return f"{d} is not searchable by other users (chmod o+x {d})"
        st = os.stat(p)
    except OSError as e:
        return f"{p}: {e.strerror}"
    if stat.S_ISDIR(st.st_mode):
        if not st.st_mode & stat.S_IROTH or not st.st_mode & stat.S_IXOTH:
            return f"{p} is not readable by other users (chmod -R o+rX {p})"
    elif not st.st_mode & stat.S_IROTH:
        return f"{p} is not readable by other users (chmod o+r {p})"
    return None


__all__ = ["binds", "hidden_by", "installation_paths", "manifest_paths", "needed_paths", "unreadable"]
