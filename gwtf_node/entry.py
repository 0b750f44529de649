"""The `gwtf-node` program (and `python -m gwtf_node`): the command line of `cli`, imported here.

Importing the command line takes seconds (its parsers name the simulator's and
the daemon's settings), and a Ctrl-C in those seconds would otherwise end in a
traceback from the middle of an import.  This module imports nothing before
it (errors.py imports nothing either): a Ctrl-C at any moment is the one line
`interrupted` and exit status 130.  That includes a Ctrl-C that Python wraps
in another exception (one landing in a class body's `__set_name__`, a
dataclass being defined during an import, comes out as a RuntimeError caused
by it) or that a nursery gathers into an exception group, and one that Python
swallowed where an exception cannot propagate (ctrlc.py: the handler notes it,
and it stops the program before an event loop starts or when the command ends).
"""

import sys

from . import ctrlc
from .errors import exception_chain


def main(argv=None) -> int:
    ctrlc.install()
    try:
        from .cli import main as cli_main

        status = cli_main(argv)
        if ctrlc.came():  # swallowed where it landed, and the command ran to its end
            raise KeyboardInterrupt
        return status
    except BaseException as exc:
        if isinstance(exc, SystemExit) or not any(isinstance(e, KeyboardInterrupt) for e in exception_chain(exc)):
            raise
        sys.stderr.write("interrupted\n")
        return 130
    finally:
        ctrlc.restore()


__all__ = ["main"]
