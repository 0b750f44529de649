"""Telling systemd how the node is doing (runtime/node/sdnotify.py), over real AF_UNIX datagram sockets.

Unit tests: the `$NOTIFY_SOCKET` address forms (a path, `@` for the abstract
namespace), the watchdog interval read from `$WATCHDOG_USEC` / `$WATCHDOG_PID`,
and `serve` under trio's mock clock: STATUS only when it changes, READY=1
once and only once the node says it joined, WATCHDOG=1 every half interval,
STOPPING=1 when cancelled.

Multi-process: a data node (the run's first node: ready once it listens) and
a relay bootstrapping to it, each a real `gwtf-node join` with its own notify
socket, as systemd starts them; both say READY=1 and keep pinging the
watchdog, the relay only after the data node accepted it; on SIGTERM they say
STOPPING=1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.net.identity import load_or_create_identity, peer_id_of
from gwtf_node.runtime.node.sdnotify import Notifier, serve, socket_address, watchdog_interval_s

START_S = 300.0  # a node process (torch and libp2p imports, model build, a peer's Hello) is ready within this
# (a deadline for the two nodes together, started at once on a loaded machine: generous, never a speed check)
# (tens of seconds alone; a few times that while another swarm shares the machine's cores)


def _listener(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    return sock


def _drain(sock: socket.socket) -> list[dict[str, str]]:
    """Every datagram waiting on `sock`, each as its KEY=VALUE fields."""
    out = []
    sock.setblocking(False)
    while True:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return out
        out.append(dict(line.split("=", 1) for line in data.decode().split("\n")))


def test_socket_address_forms() -> None:
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@gwtf/notify") == b"\0gwtf/notify"


@pytest.mark.parametrize(("env", "seconds"), [
    ({}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "junk"}, None),
    ({"WATCHDOG_USEC": "120000000"}, 60.0),
    ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "4242"}, 1.5),
    ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "4243"}, None),  # meant for another process
])
def test_watchdog_interval_is_half_of_what_systemd_asks(env: dict, seconds: float | None) -> None:
    assert watchdog_interval_s(env, pid=4242) == seconds


def test_notifier_sends_one_datagram_of_lines_to_a_path_and_to_the_abstract_namespace(tmp_path: Path) -> None:
    abstract = f"@gwtf-test-{os.getpid()}-{time.monotonic_ns()}"
    for name, bind_to in ((str(tmp_path / "notify"), str(tmp_path / "notify")), (abstract, socket_address(abstract))):
        with _listener(bind_to) as sock:
            notifier = Notifier.from_env({"NOTIFY_SOCKET": name})
            assert notifier is not None
            assert notifier.send(READY=1, STATUS="joined\nstage 1")
            assert _drain(sock) == [{"READY": "1", "STATUS": "joined stage 1"}]  # a value stays one line
            notifier.close()
    assert Notifier.from_env({}) is None  # not started by systemd: nothing to say


def test_a_lost_notify_socket_is_counted_not_raised(tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "nobody-listens"))
    assert not notifier.send(WATCHDOG=1)
    assert not notifier.send(WATCHDOG=1)
    assert notifier.failures == 2
    notifier.close()


def test_serve_says_ready_once_joined_and_pings_the_watchdog(tmp_path: Path) -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    path = str(tmp_path / "notify")
    sock = _listener(path)
    state = {"ready": False, "status": "relay r1: starting (loading the model)"}
    got: list[dict[str, str]] = []

    async def main() -> None:
        notifier = Notifier(path)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve(notifier, ready=lambda: state["ready"], status=lambda: state["status"],
                                             watchdog_s=0.5, status_every_s=2.0))
            await trio.sleep(1.2)  # ticks at 0, 0.5, 1.0: the watchdog's half interval
            got.extend(_drain(sock))
            state["status"] = "relay r1: joined, stage 1, 3 peers, 0 steps applied"
            state["ready"] = True
            await trio.sleep(0.5)
            got.extend(_drain(sock))
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        notifier.close()
        got.extend(_drain(sock))

    trio.run(main, clock=clock)
    sock.close()
    assert got[0] == {"STATUS": "relay r1: starting (loading the model)", "WATCHDOG": "1"}
    assert got[1:3] == [{"WATCHDOG": "1"}, {"WATCHDOG": "1"}]  # the status did not change: not repeated
    assert got[3] == {"STATUS": "relay r1: joined, stage 1, 3 peers, 0 steps applied", "READY": "1",
                      "MAINPID": str(os.getpid()), "WATCHDOG": "1"}
    assert got[4] == {"WATCHDOG": "1"}  # READY=1 is said once
    assert got[-1] == {"STOPPING": "1", "STATUS": "stopping"}
    assert sum("READY" in g for g in got) == 1


def _join(tmp_path: Path, name: str, notify: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, NOTIFY_SOCKET=notify, WATCHDOG_USEC="1000000")  # a ping every 0.5 s
    return subprocess.Popen([sys.executable, "-m", "gwtf_node.cli", "join", "--run", str(tmp_path / "run.json"),
                             "--state-dir", str(tmp_path / name), "--name", name, "--device", "cpu", "--insecure-unsigned", *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.err", "w"))


def _until(sock: socket.socket, deadline: float, done, what: str, got: list[dict[str, str]]) -> None:
    """Receive datagrams into `got` until `done(got)`; fail at `deadline` saying what was awaited."""
    sock.setblocking(True)
    while not done(got):
        left = deadline - time.monotonic()
        assert left > 0, f"no {what} within the deadline; received {got[-5:]}"
        sock.settimeout(left)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        got.append(dict(line.split("=", 1) for line in data.decode().split("\n")))


def _after_ready(got: list[dict[str, str]], key: str) -> int:
    ready = next((i for i, g in enumerate(got) if "READY" in g), None)
    return 0 if ready is None else sum(key in g for g in got[ready + 1:])


def _start_both(tmp_path: Path, d_sock: socket.socket, r_sock: socket.socket) -> list[subprocess.Popen]:
    """The data node and the relay, started at once: the data node's identity and port are known beforehand, and
    the relay retries its bootstrap dial until the data node listens.  A port found free may be taken by another
    test's process before the data node binds it (the node then exits saying so): started again on another."""
    for _attempt in range(3):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_of(load_or_create_identity(tmp_path / 'd0'))}"
        procs = [_join(tmp_path, "d0", str(tmp_path / "d0.notify"), "--role", "data", "--port", str(port)),
                 _join(tmp_path, "r1", f"@gwtf-r1-{os.getpid()}", "--role", "relay", "--stage", "0",
                       "--bootstrap", addr)]
        listening = time.monotonic() + START_S
        while procs[0].poll() is None and not (tmp_path / "d0" / "addr").exists() and time.monotonic() < listening:
            time.sleep(0.05)
        if procs[0].poll() is None or "is in use" not in (tmp_path / "d0.err").read_text():
            return procs
        for p in procs:
            p.kill()
            p.wait(timeout=30)
        for sock in (d_sock, r_sock):  # (what the nodes of this attempt said)
            _drain(sock)
    raise AssertionError(f"the data node found its port in use three times: {(tmp_path / 'd0.err').read_text()}")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_real_nodes_say_ready_when_joined_and_ping_the_watchdog(tmp_path: Path) -> None:
    save_manifest(default_manifest(), tmp_path / "run.json")
    d_sock, r_sock = _listener(str(tmp_path / "d0.notify")), _listener(f"\0gwtf-r1-{os.getpid()}")
    d_got: list[dict[str, str]] = []
    r_got: list[dict[str, str]] = []
    procs: list[subprocess.Popen] = []
    try:
        procs = _start_both(tmp_path, d_sock, r_sock)
        deadline = time.monotonic() + START_S
        _until(d_sock, deadline, lambda g: _after_ready(g, "WATCHDOG") >= 2, "READY=1 and watchdog pings", d_got)
        ready = next(g for g in d_got if "READY" in g)
        assert ready["MAINPID"] == str(procs[0].pid)
        # ready as the run's first node, or already met by the relay when its first status goes out
        assert "first node of the run" in ready["STATUS"] or "joined" in ready["STATUS"], ready
        _until(r_sock, deadline, lambda g: _after_ready(g, "WATCHDOG") >= 2, "the relay's READY=1", r_got)
        at = next(i for i, g in enumerate(r_got) if "READY" in g)
        assert r_got[at]["STATUS"].startswith("relay r1: joined, stage 0"), r_got[at]  # the status says so too
        before = [g["STATUS"] for g in r_got[:at] if "STATUS" in g]
        assert before and not any("joined" in s for s in before), before  # starting, dialing: not ready yet
        # the data node's queue filled while the test listened to the relay (a full queue loses datagrams,
        # never blocks the node); emptied, it has room for STOPPING=1
        d_got.extend(_drain(d_sock))
        for p in procs:  # a node not yet training stops at once on SIGTERM (one that trains leaves first)
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        deadline = time.monotonic() + 10
        _until(d_sock, deadline, lambda g: any("STOPPING" in x for x in g), "STOPPING=1", d_got)
        _until(r_sock, deadline, lambda g: any("STOPPING" in x for x in g), "STOPPING=1", r_got)
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
        d_sock.close()
        r_sock.close()
