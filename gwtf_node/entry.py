"""The `gwtf-node` program (and `python -m gwtf_node`): the command line of `cli`, imported here.

Importing the command line takes seconds (its parsers name the simulator's and
the daemon's settings), and a Ctrl-C in those seconds would otherwise end in a
traceback from the middle of an import.  This module imports nothing before
it: a Ctrl-C at any moment is the one line `interrupted` and exit status 130.
"""

import sys


def main(argv=None) -> int:
    try:
        from .cli import main as cli_main

        return cli_main(argv)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


__all__ = ["main"]
