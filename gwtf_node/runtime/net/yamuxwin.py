"""Yamux window updates as go-yamux sends them: once half the receive window has been read, not after every read.

A yamux receiver tells the sender how much more it may send (a window update
frame, encrypted and written like any other).  go-yamux sends one when the
bytes read since the last update reach half the window (`sendWindowUpdate`:
`delta < max/2` returns without a frame).  py-libp2p 0.8.1's
`YamuxStream._auto_tune_and_send_window_update` has that rule, and then a
"partial slack" branch that sends an update whenever anything was read below
it: with `PY_YAMUX_RELEASE_ON_READ=0` (hostlisten.py) about every other read
of a control stream still answered with a window update (the branch gives
back what was read twice, so the next read finds nothing to give), half an
extra encrypted write per control frame each way.  `install` replaces the
method with the go rule: the update (the window grown back to its target,
and its auto-tuned growth) when the bytes read since the last one reach
`_grow_threshold()` (half the target window), nothing otherwise.  A sender never waits on it: it may send a whole
window before it blocks, and the reader's update comes once it read half.

Measured with a Ping and its Pong over one connection (`python
scripts/bench_ctrl_frames.py`): 0.5 window updates per frame before, none
after the first two (the window's growth); 0.80 x the CPU per frame and its
answer.  Installed only over py-libp2p 0.8.1's method, the one it was read
from (`YAMUX_VERSION`); another version keeps its own.  An operator who sets
`PY_YAMUX_RELEASE_ON_READ=1` (py-libp2p's default, which hostlisten.py turns
off unless set) gets py-libp2p's own rule, an update after every read.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("gwtf.transport")

YAMUX_VERSION = "0.8.1"  # the py-libp2p whose YamuxStream this replaces a method of (module doc)
_installed: list = []  # the method replaced, once installed (tests compare against it)
_library_rule = False  # py-libp2p's own rule asked for, as `install` last read it (not read again at each read)


def _release_on_read() -> bool:
    """Whether py-libp2p's release on read is asked for (`PY_YAMUX_RELEASE_ON_READ`, on unless 0/false/no)."""
    return os.environ.get("PY_YAMUX_RELEASE_ON_READ", "1").upper() not in ("0", "FALSE", "NO")


async def _go_window_update(self, *, bytes_read: int = 0) -> None:
    """go-yamux's `sendWindowUpdate` for a `YamuxStream` after a read of `bytes_read` bytes (module doc); with
    py-libp2p's release on read asked for (an operator's `PY_YAMUX_RELEASE_ON_READ=1`), py-libp2p's own rule."""
    if _library_rule and _installed:
        return await _installed[0](self, bytes_read=bytes_read)
    total = 0
    async with self.window_lock:
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        delta = self.target_recv_window - (self.recv_window + buffered)  # read since the last update
        if delta > 0 and delta >= self._grow_threshold():
            total = self._grow_to_delta(buffered) + self._apply_autotune_epoch(buffered)
            self._pending_recv_release = 0
    if total > 0:  # (never under the window lock: an incoming update takes it too)
        await self.send_window_update(total, skip_lock=True)


def install() -> bool:
    """Replace py-libp2p's window-update rule with go-yamux's (module doc); whether it is in place.  Each call (one
    per host, hostlisten.py) reads `PY_YAMUX_RELEASE_ON_READ` again: the rule every later read follows."""
    global _library_rule
    import libp2p
    from libp2p.stream_muxer.yamux.yamux import YamuxStream

    _library_rule = _release_on_read()
    if _installed:
        return True
    version = getattr(libp2p, "__version__", "?")
    if version != YAMUX_VERSION or not hasattr(YamuxStream, "_auto_tune_and_send_window_update"):
        log.debug("py-libp2p %s: its own yamux window updates kept (yamuxwin.py reads %s's)", version, YAMUX_VERSION)
        return False
    _installed.append(YamuxStream._auto_tune_and_send_window_update)
    YamuxStream._auto_tune_and_send_window_update = _go_window_update
    return True
