"""A fork server for local swarms: nodes forked from one process that has already imported what a node needs.

A node process spends most of its start-up importing torch, the model
classes of transformers and libp2p (about 7 s of CPU on a 2-core machine,
against well under a second for the rest of its start).  `LocalSwarm`
(local.py) starts one `Zygote` that does those imports once, then forks every
node of the swarm from it: the child makes itself a session leader (so that
`os.killpg(pid, ...)` reaches it and only it), points its stdout and stderr at
the node's log, takes the node's environment, and runs `gwtf-node` with the
node's arguments, as the `python -m gwtf_node.cli` process it replaces would.
What a child runs is the zygote's parameter: `serve(run)` forks children
that call `run(argv)`, and the command that starts the zygote process is the
launcher's parameter (`Zygote(command)`).  The program that serves is
`gwtf_node/cli/forkserver.py`: its imports are what the children find
imported, and it hands `serve` the command line's `main`; this module imports
nothing of the layers above it.

The zygote imports only: it starts no event loop and never touches a GPU, so
the children initialise CUDA, torch's thread pools and trio themselves, as a
fresh process does (PyTorch's own DataLoader forks workers after `import
torch` in the same way).

Protocol on the zygote's stdin / stdout, one JSON object per line: it says
`{"ready": true}` once imported; each request `{"argv": [...], "env": {...},
"log": PATH, "exit": PATH}` (and `"netns": NAME` for a child that lives in
the network namespace `/run/netns/NAME`, as under `ip netns exec`; `"nice":
N` for one that runs at that niceness, as under `nice -n N`) is
answered `{"pid": N}` once the child is its own session.  The zygote reaps its children and writes each one's exit status, as
`Popen.returncode` gives it (negative: killed by that signal), to the request's
`exit` file; `ZygoteChild` is the `Popen`-like handle the launcher keeps.  When
its stdin closes (the launcher stopped or died) the zygote kills the children
still running and exits.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Sequence

READY_TIMEOUT_S = 120.0  # the imports of a zygote on a loaded machine
SPAWN_TIMEOUT_S = 30.0


class ZygoteError(RuntimeError):
    pass


class ZygoteChild:
    """A node forked by the zygote: the part of `subprocess.Popen` the launcher and the tests use."""

    def __init__(self, pid: int, exit_path: Path, zygote: "Zygote") -> None:
        self.pid = pid
        self.exit_path = exit_path
        self.zygote = zygote
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                text = self.exit_path.read_text().strip()
            except OSError:
                text = ""
            if text:
                self.returncode = int(text)
            elif self.zygote.proc.poll() is not None and not _alive(self.pid):
                self.returncode = -signal.SIGKILL  # (its status died with the zygote that reaped it)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"node {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Zygote:
    """The launcher's end: starts the zygote process, asks it for children, stops it."""

    def __init__(self, command: Sequence[str]) -> None:
        """Start the zygote process with `command` (a program that calls `serve`, e.g. cli/forkserver.py)."""
        # its own session: a Ctrl-C at the launcher's terminal is the launcher's to handle (it stops the nodes)
        self.proc = subprocess.Popen(list(command), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1,
                                     start_new_session=True)
        try:
            reply = self._read(READY_TIMEOUT_S)
        except ZygoteError:
            self.close()  # (no process is left behind)
            raise
        if not reply.get("ready"):
            self.close()
            raise ZygoteError(f"the fork server did not start: {reply}")

    def _read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise ZygoteError(f"no answer from the fork server within {timeout:.0f} s"
                              if not ready else f"the fork server exited ({self.proc.poll()})")
        return json.loads(line)

    def spawn(self, argv: list[str], env: dict[str, str], log: Path, exit_path: Path,
              netns: str | None = None, nice: int = 0) -> ZygoteChild:
        """Fork a child that runs `argv`; `netns`: the network namespace (`ip netns` name) it enters first;
        `nice`: added to its niceness before it starts a thread."""
        exit_path.unlink(missing_ok=True)
        req = {"argv": list(argv), "env": dict(env), "log": str(log), "exit": str(exit_path)}
        if netns is not None:
            req["netns"] = str(netns)
        if nice:
            req["nice"] = int(nice)
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise ZygoteError(f"the fork server is gone: {e}") from e
        reply = self._read(SPAWN_TIMEOUT_S)
        if "pid" not in reply:
            raise ZygoteError(f"the fork server refused {argv[:2]}: {reply}")
        return ZygoteChild(int(reply["pid"]), exit_path, self)

    def close(self) -> None:
        """Stop the zygote (it kills the children still running: stop them first to let them leave)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ---------------------------------------------------------------------------------------------- the zygote's side
Run = Callable[[list[str]], int | None]  # a command line's main: argv (without the program) -> exit status


CLONE_NEWNET = 0x40000000  # <sched.h>


def enter_netns(name: str) -> None:
    """Move this (single-threaded, just forked) process into the network namespace `ip netns add NAME` made."""
    fd = os.open(os.path.join("/run/netns", name), os.O_RDONLY)
    try:
        if hasattr(os, "setns"):  # Python 3.12+
            os.setns(fd, CLONE_NEWNET)
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _child(run: Run, req: dict, told: int) -> None:
    """In the forked child: become the node by calling `run` with its arguments (never returns)."""
    code = 1
    try:
        os.setsid()
        os.write(told, b"x")
        os.close(told)
        out = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        if req.get("netns"):
            enter_netns(str(req["netns"]))
        if req.get("nice"):
            os.nice(int(req["nice"]))  # (single-threaded still: every thread the node starts inherits it)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["gwtf-node", *req["argv"]]
        code = run(req["argv"])  # the command line is this child's program, as `python -m gwtf_node.cli` a process's
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - the node's log says what happened, the status that it failed
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def freeze_heap() -> None:
    """Collect, then move every object of this process to the collector's permanent generation (`gc.freeze`), so
    that no collection in a forked child writes to them: a child's first full collection would otherwise touch
    every page of the imported modules' objects and copy it (about 120 MiB a node of torch, transformers and libp2p;
    with the freeze about 2 MiB)."""
    gc.collect()
    gc.freeze()


def serve(run: Run) -> int:
    """Serve the launcher on stdin / stdout: fork a child that calls `run(argv)` for each request, until stdin closes.

    What the children find imported is what the caller imported before calling (cli/forkserver.py); it is frozen
    first (`freeze_heap`), so that the children share it."""
    freeze_heap()
    out = sys.stdout
    children: dict[int, Path] = {}

    def say(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            path = children.pop(pid, None)
            if path is not None:
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(f"{os.waitstatus_to_exitcode(status)}\n")
                tmp.replace(path)

    say({"ready": True})
    stdin = sys.stdin
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.05)
        reap()
        if not ready:
            continue
        line = stdin.readline()
        if not line:
            break
        try:
            req = json.loads(line)
            argv, exit_path = [str(a) for a in req["argv"]], Path(req["exit"])
            str(req["log"])
            dict(req["env"])
        except (ValueError, KeyError, TypeError) as e:
            say({"error": f"bad request: {e}"})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(run, {**req, "argv": argv}, w)
        os.close(w)
        select.select([r], [], [], SPAWN_TIMEOUT_S)  # it is its own session (or it died trying)
        os.close(r)
        children[pid] = exit_path
        say({"pid": pid})
    for pid in list(children):  # the launcher is gone: nothing of the swarm outlives it
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 10
    while children and time.monotonic() < deadline:
        reap()
        time.sleep(0.02)
    return 0
