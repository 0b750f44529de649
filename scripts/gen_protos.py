#!/usr/bin/env python3
"""Regenerate gwtf_node/protocol/gwtf_pb2.py (and .pyi) from protos/gwtf.proto.

    python scripts/gen_protos.py           # rewrite the committed files
    python scripts/gen_protos.py --check   # exit 1 if they are stale

The generated code is committed, so it must not depend on who ran the
generator: the protoc bundled in grpcio-tools is pinned through the accepted
grpcio-tools versions below.  Their protoc (31.1) emits code that asks for a
protobuf runtime >= 6.31.1 and < 7, which is the range libp2p 0.8.1 allows;
grpcio-tools >= 1.81 bundles a newer protoc (33.x, then 35.x) whose code
refuses to load under an older 6.x runtime (or under any 6.x at all).
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.metadata
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
PROTO_FILE = PROTO_DIR / "gwtf.proto"
OUT_DIR = ROOT / "gwtf_node" / "protocol"
GENERATED = ("gwtf_pb2.py", "gwtf_pb2.pyi")

# grpcio-tools releases that bundle libprotoc 31.1; keep in step with pyproject.toml.
GRPCIO_TOOLS_MIN = (1, 74)
GRPCIO_TOOLS_BELOW = (1, 81)
GRPCIO_TOOLS_SPEC = "grpcio-tools>=1.74,<1.81"


def _check_grpcio_tools() -> None:
    try:
        version = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"grpcio-tools is not installed: run pip install -e '.[dev]' (needs {GRPCIO_TOOLS_SPEC})")
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    if not GRPCIO_TOOLS_MIN <= major_minor < GRPCIO_TOOLS_BELOW:
        sys.exit(
            f"grpcio-tools {version} is installed but the committed code is generated with "
            f"the protoc of {GRPCIO_TOOLS_SPEC} (libprotoc 31.1, loads under protobuf >=6.31.1,<7): "
            f"run pip install '{GRPCIO_TOOLS_SPEC}'"
        )


def generate(out_dir: Path) -> None:
    """Run the bundled protoc on protos/gwtf.proto, writing into `out_dir`."""
    from grpc_tools import protoc  # imported here so that --help works without it

    args = [
        "protoc",
        f"--proto_path={PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(PROTO_FILE),
    ]
    status = protoc.main(args)
    if status != 0:
        sys.exit(f"protoc failed with status {status} on {PROTO_FILE.relative_to(ROOT)} (see its message above)")


def check() -> int:
    """Regenerate into a temporary directory and compare with the committed files."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            name for name in GENERATED
            if not (OUT_DIR / name).exists() or not filecmp.cmp(Path(tmp) / name, OUT_DIR / name, shallow=False)
        ]
    if stale:
        names = ", ".join(str((OUT_DIR / name).relative_to(ROOT)) for name in stale)
        proto = PROTO_FILE.relative_to(ROOT)
        fix = "run python scripts/gen_protos.py and commit the result"
        print(f"{names} out of date with {proto}: {fix}", file=sys.stderr)
        return 1
    print(f"generated code is current with {PROTO_FILE.relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed generated code is stale")
    args = parser.parse_args(argv)
    _check_grpcio_tools()
    if args.check:
        return check()
    generate(OUT_DIR)
    print(f"wrote {', '.join(str((OUT_DIR / name).relative_to(ROOT)) for name in GENERATED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
