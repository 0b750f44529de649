"""Running `gwtf-node` in a real pseudo-terminal, as a user's terminal would (the live dashboard needs one)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time

# `trap "" INT` then exec: the command starts with SIGINT ignored, as every command of a script's background job
# does (POSIX: an asynchronous list of a non-interactive shell); exec keeps an ignored signal ignored
SIGINT_IGNORED = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]


def run_in_pty(args: list[str], *, interrupt_when=None, timeout_s: float = 180,
               sigint_ignored: bool = False) -> tuple[int, str]:
    """Run `gwtf-node ARGS` with a pseudo-terminal as its stdin/stdout/stderr; (exit status, what it drew).
    `interrupt_when(drawn)`: Ctrl-C (SIGINT) once it is true of what was drawn so far; `sigint_ignored`: started
    with SIGINT ignored (`SIGINT_IGNORED`)."""
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="140", LINES="60", TERM="xterm-256color")
    cmd = [sys.executable, "-m", "gwtf_node.cli", *args]
    proc = subprocess.Popen(SIGINT_IGNORED + cmd if sigint_ignored else cmd, stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout_s
    interrupted = interrupt_when is None
    try:
        # read what it draws until it exits: a child whose terminal nobody reads blocks on its next write
        while time.monotonic() < deadline:
            if not interrupted and interrupt_when(out.decode(errors="replace")) and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                interrupted = True
                deadline = time.monotonic() + 30  # from Ctrl-C: it leaves the live view and exits
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        drawn = out.decode(errors="replace")
        assert interrupted or proc.poll() is not None, \
            f"not interrupted: what it drew within {timeout_s:.0f} s never met the condition; drew {drawn[-2000:]!r}"
        try:
            return proc.wait(timeout=max(1.0, deadline - time.monotonic())), drawn
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 30 s after Ctrl-C; drew {drawn[-2000:]!r}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
