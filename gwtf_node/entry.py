"""The `gwtf-node` program (and `python -m gwtf_node`): the command line of `cli`, imported here.

Importing the command line takes seconds (its parsers name the simulator's and
the daemon's settings), and a Ctrl-C in those seconds would otherwise end in a
traceback from the middle of an import.  This module imports nothing before
it: a Ctrl-C at any moment is the one line `interrupted` and exit status 130.
That includes a Ctrl-C that Python wraps in another exception: one landing
in a class body's `__set_name__` (a dataclass field being defined during an
import) comes out as a RuntimeError caused by the KeyboardInterrupt.
"""

import sys


def interrupted(exc: BaseException | None) -> bool:
    """Whether `exc` is a KeyboardInterrupt or was caused by one (its `__cause__` / `__context__` chain)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return False


def main(argv=None) -> int:
    try:
        from .cli import main as cli_main

        return cli_main(argv)
    except Exception as exc:  # noqa: BLE001 - re-raised unless a Ctrl-C caused it
        if not interrupted(exc):
            raise
        sys.stderr.write("interrupted\n")
        return 130
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


__all__ = ["interrupted", "main"]
