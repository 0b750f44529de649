"""A Ctrl-C that Python swallowed still stops the program: the handler notes it before it raises.

Python runs a signal's handler at the next bytecode, wherever that is.  If it
is a weakref callback or a `__del__` (the import system's module locks die
in one at the end of every import), the KeyboardInterrupt it raises is
printed as "Exception ignored in ..." and lost, and `gwtf-node join` would
start its node as if no Ctrl-C had come.  `entry.py` installs `on_ctrl_c`
for the whole command line; `hand_over` gives SIGINT back to Python's own
handler just before an event loop takes it (trio installs its own handling
only over that one) and raises the Ctrl-C that came before, if one did.
Nothing is imported here but `signal` and `threading`.
"""

from __future__ import annotations

import signal
import threading

_came = False


def on_ctrl_c(signum: int, frame: object) -> None:
    """SIGINT's handler while the command line runs: note the Ctrl-C, then raise it as Python's own would."""
    global _came
    _came = True
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGINT with `on_ctrl_c` where Python's default handler has it: in the main thread, and not where
    SIGINT is ignored (elsewhere nothing changes)."""
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_ctrl_c)


def came() -> bool:
    """Whether a Ctrl-C came since `install`, raised or swallowed."""
    return _came


def restore() -> None:
    """Python's default handler again, where `install` replaced it; no Ctrl-C noted."""
    global _came
    if signal.getsignal(signal.SIGINT) is on_ctrl_c:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _came = False


def hand_over() -> None:
    """Before an event loop runs: SIGINT goes back to Python's own handler (which trio replaces with its own), and
    a Ctrl-C noted before, even one an ignored exception swallowed, raises KeyboardInterrupt now."""
    if signal.getsignal(signal.SIGINT) is on_ctrl_c:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _came:
        raise KeyboardInterrupt


__all__ = ["came", "hand_over", "install", "on_ctrl_c", "restore"]
