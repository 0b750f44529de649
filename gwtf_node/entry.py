"""The `gwtf-node` program (and `python -m gwtf_node`): the command line of `cli`, imported here.

Importing the command line takes seconds (its parsers name the simulator's and
the daemon's settings), and a Ctrl-C in those seconds would otherwise end in a
traceback from the middle of an import.  This module imports nothing before
it (errors.py imports nothing either): a Ctrl-C at any moment is the one line
`interrupted` and exit status 130.  That includes a Ctrl-C that Python wraps
in another exception (one landing in a class body's `__set_name__`, a
dataclass being defined during an import, comes out as a RuntimeError caused
by it) or that a nursery gathers into an exception group.
"""

import sys

from .errors import exception_chain


def main(argv=None) -> int:
    try:
        from .cli import main as cli_main

        return cli_main(argv)
    except BaseException as exc:
        if isinstance(exc, SystemExit) or not any(isinstance(e, KeyboardInterrupt) for e in exception_chain(exc)):
            raise
        sys.stderr.write("interrupted\n")
        return 130


__all__ = ["main"]
