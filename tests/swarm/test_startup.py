"""Start-up checks: a node that cannot join says why in one line and exits, instead of running on silently.

Unit tests: the state directory lock, the port probe (also with leftovers in
TIME_WAIT and a SO_REUSEPORT listener like py-libp2p's), the bootstrap
backoff schedule, the short reasons shown for a failed dial, and the rule
that only a refusal from a peer we greeted, before any peer accepted us,
stops a node, and the `Refused` answer a refused Hello gets.

Multi-process: one data node runs on a fixed port; against it, at the same
time, `gwtf-node join` processes meet each failure: its port (a second gwtf
node), a port a plain program listens on, its state directory, a relay with
another run.json bootstrapping to it, and a relay whose bootstrap address
answers nothing.  Each exits non-zero with one `error:` line and no
traceback; the data node runs on, its `addr` untouched; killed with SIGKILL
it restarts at once on the same state directory and port.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net.bootstrap import Bootstrap, BootstrapState, backoff_s, dial_reason, one_line
from gwtf_node.runtime.net.discovery import Discovery
from gwtf_node.runtime.net.identity import load_or_create_identity, peer_id_of
from gwtf_node.runtime.net.peers import Peers, Place
from gwtf_node.runtime.ops.startup import ExitKind, NodeExit, PortInUse, check_port_free, first_startup_error
from gwtf_node.runtime.ops.statedir import StateDirLocked, lock_state_dir
from gwtf_node.runtime.net.wire import FrameRefused

from support.helpers import free_port

BOOTSTRAP_TIMEOUT_S = 5.0
START_S = 60.0  # a node process (torch and libp2p imports, model build) is listening within this
EXIT_MARGIN_S = 45.0  # process start-up and teardown around the bootstrap timeout, with five processes at once


def processes(test):
    """Marks a test that runs `gwtf-node join` processes itself (conftest finds LocalSwarm users on its own)."""
    return pytest.mark.multiprocess(pytest.mark.slow(test))


# ---- the state directory lock ------------------------------------------------------------------------------


def test_a_state_directory_is_held_by_one_lock_at_a_time(tmp_path: Path) -> None:
    with lock_state_dir(tmp_path / "s") as lock:
        assert (tmp_path / "s" / "lock").read_text().strip() == str(os.getpid())
        with pytest.raises(StateDirLocked, match=f"pid {os.getpid()}") as caught:
            lock_state_dir(tmp_path / "s")  # a second open file description: refused like another process
        assert caught.value.holder_pid == os.getpid()
        assert "another --state-dir" in str(caught.value) and "\n" not in str(caught.value)
        assert lock.held
    assert not lock.held
    lock_state_dir(tmp_path / "s").release()  # free again once released


def test_the_lock_dies_with_its_process(tmp_path: Path) -> None:
    """Another process holds it (its pid is named); after SIGKILL it is free at once."""
    code = ("import sys, time\nfrom gwtf_node.runtime.ops.statedir import lock_state_dir\n"
            "lock = lock_state_dir(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "s")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(StateDirLocked) as caught:
            lock_state_dir(tmp_path / "s")
        assert caught.value.holder_pid == child.pid
        child.kill()
        child.wait(timeout=10)
        with lock_state_dir(tmp_path / "s"):
            assert (tmp_path / "s" / "lock").read_text().strip() == str(os.getpid())
    finally:
        child.kill()
        child.wait(timeout=10)


# ---- the port probe ----------------------------------------------------------------------------------------


def test_a_port_someone_listens_on_is_in_use() -> None:
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        port = plain.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {port} on 127.0.0.1 is in use"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # closed: free again
    check_port_free("127.0.0.1", 0)  # any free port is never in use


def test_a_reuseport_listener_is_seen_too() -> None:
    """py-libp2p listens with SO_REUSEPORT; a second libp2p host would listen beside it, the probe does not."""
    with socket.socket() as libp2p_like:
        libp2p_like.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        libp2p_like.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        libp2p_like.bind(("127.0.0.1", 0))
        libp2p_like.listen()
        with pytest.raises(PortInUse):
            check_port_free("127.0.0.1", libp2p_like.getsockname()[1])


def test_connections_in_time_wait_do_not_hold_the_port() -> None:
    """A node killed a moment ago leaves its accepted connections in TIME_WAIT: its restart takes the port.

    The listener sets SO_REUSEADDR as py-libp2p's and trio's do (its accepted connections inherit it; Linux
    lets a new bind pass a TIME_WAIT socket only when both have it)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end of the connection goes to TIME_WAIT
        client.recv(1)  # the FIN arrived
        client.close()
    states = subprocess.run(["ss", "-tan", f"sport = :{port}"], capture_output=True, text=True).stdout
    if "TIME-WAIT" not in states:
        pytest.skip(f"no TIME_WAIT socket on port {port} to test with: {states!r}")
    check_port_free("127.0.0.1", port)


def test_the_startup_error_is_found_inside_exception_groups() -> None:
    err = PortInUse("127.0.0.1", 7)
    assert first_startup_error(ExceptionGroup("outer", [ValueError("x"), ExceptionGroup("inner", [err])])) is err
    assert first_startup_error(ExceptionGroup("outer", [ValueError("x")])) is None


def test_join_refuses_a_locked_state_directory_and_a_port_in_use_before_starting(tmp_path: Path, capsys) -> None:
    """The checks come before the model is built: one line, exit 2, and the lock is left as it was."""
    from gwtf_node.cli import main

    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=1, layers=1, hidden=16, seq_len=8), run)
    join = ["join", "--run", str(run), "--role", "relay", "--stage", "0", "--insecure-unsigned"]
    with lock_state_dir(tmp_path / "held"):
        assert main([*join, "--state-dir", str(tmp_path / "held")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: state directory") and f"pid {os.getpid()}" in err and "\n" not in err
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        port = plain.getsockname()[1]
        assert main([*join, "--state-dir", str(tmp_path / "free"), "--port", str(port)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: port {port} on 127.0.0.1 is in use") and "\n" not in err
    lock_state_dir(tmp_path / "free").release()  # the failed join gave its lock back
    assert not (tmp_path / "free" / "identity.key").exists()  # nothing written before the checks


# ---- the bootstrap: backoff, reasons, refusals ---------------------------------------------------------------


def test_backoff_doubles_from_one_second_up_to_thirty() -> None:
    assert [backoff_s(k) for k in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff_s(10_000) == 30  # no overflow after days of retries
    assert backoff_s(3, first_s=0.5, cap_s=1.5) == 1.5
    with pytest.raises(ValueError):
        backoff_s(0)


def test_a_failed_dial_is_shown_by_its_root_cause() -> None:
    refused = ConnectionRefusedError(111, "Error connecting to ('127.0.0.1', 1): Connection refused")
    inner = OSError("all attempts to connect to 127.0.0.1:1 failed")
    inner.__cause__ = ExceptionGroup("all attempts failed", [refused])
    outer = RuntimeError("unable to connect to 12D3KooW..., no addresses established a successful connection")
    outer.__cause__ = inner
    assert dial_reason(outer) == os.strerror(111)
    slow = RuntimeError("cannot connect to /ip4/1.2.3.4/tcp/1")
    slow.__cause__ = trio.TooSlowError()
    assert dial_reason(slow) == "no answer in time"
    plain = RuntimeError("unable to connect to X")
    plain.__cause__ = ValueError("failed to negotiate the secure protocol\nmore")
    assert dial_reason(plain) == "failed to negotiate the secure protocol more"


def test_a_peers_words_become_one_short_printable_line() -> None:
    assert one_line("a\nb\x1b[31mc\td") == "a b [31mc d"
    assert len(one_line("x" * 1000)) == 300 and one_line("x" * 1000).endswith("...")


def _bootstrap(greeted: set[str]) -> tuple[Bootstrap, list[NodeExit]]:
    exits: list[NodeExit] = []
    peers = SimpleNamespace(me="me", who=lambda p: p[:8], ids_known=lambda: [])
    discovery = SimpleNamespace(hellos_sent=greeted)
    host = SimpleNamespace(dht=None, addrs=["/ip4/127.0.0.1/tcp/1/p2p/me"])
    b = Bootstrap(SimpleNamespace(), peers, discovery, host, ["/ip4/127.0.0.1/tcp/2/p2p/boot"], timeout_s=5,
                  on_exit=exits.append)
    return b, exits


@pytest.mark.trio
async def test_a_refusal_stops_the_node_only_before_any_peer_accepted_it() -> None:
    refusal = m.Refused(m.RefusalCode.OTHER_RUN, "Hello for run 'a', this node trains run 'b':\nyour run.json differs")
    b, exits = _bootstrap(greeted={"boot"})
    b.on_refused("stranger", refusal)  # a peer we never greeted cannot stop us
    assert exits == [] and b.state is BootstrapState.DIALING
    b.on_refused("boot", refusal)
    assert exits == [NodeExit(ExitKind.REFUSED, "refused by peer boot: Hello for run 'a', this node trains run "
                                                "'b': your run.json differs")]
    assert b.state is BootstrapState.REFUSED

    b, exits = _bootstrap(greeted={"boot", "other"})
    b.on_peer_hello()  # a peer accepted us: from now on a refusal is only logged
    b.on_refused("other", refusal)
    assert exits == [] and b.state is BootstrapState.CONNECTED
    assert b.snapshot()["state"] == "connected" and b.snapshot()["gives_up_in_s"] is None


def test_a_refused_hello_is_answered_with_the_reason() -> None:
    posted: list[tuple[str, m.Message]] = []
    wire = SimpleNamespace(me="me", post=lambda peer, msg: posted.append((peer, msg)))
    discovery = Discovery(wire, Peers("me", "d0", 2, Place("data", -1, 4)), SimpleNamespace(),
                          SimpleNamespace(run_id="abc"), {}, on_peer_hello=lambda info: None)
    cases = [(m.Hello("xyz", "relay", 0, "r", 1, ()), m.RefusalCode.OTHER_RUN,
              "Hello for run 'xyz', this node trains run 'abc': your run.json differs from the swarm's"),
             (m.Hello("abc", "boss", 0, "r", 1, ()), m.RefusalCode.NO_SUCH_ROLE, "a node is a data node or a relay"),
             (m.Hello("abc", "relay", 2, "r", 1, ()), m.RefusalCode.NO_SUCH_STAGE, "run 'abc' has stages 0..1")]
    for hello, code, words in cases:
        posted.clear()
        with pytest.raises(FrameRefused):
            discovery.on_hello("peer", hello)
        ((to, answer),) = posted
        assert to == "peer" and answer.code is code and words in answer.reason, answer
    assert discovery.peers.ids_known() == []  # nobody refused was taken in


# ---- real processes ----------------------------------------------------------------------------------------


@dataclass
class Outcome:
    rc: int
    seconds: float  # from spawn to exit
    stderr: str

    @property
    def last_line(self) -> str:
        return self.stderr.strip().splitlines()[-1] if self.stderr.strip() else ""


def _join(name: str, state_dir: Path, run: Path, *args: str) -> tuple[subprocess.Popen, Path, float]:
    """Start `gwtf-node join`; its stderr (the log, then the error line) goes to `<name>.stderr` beside."""
    state_dir.mkdir(parents=True, exist_ok=True)
    err = state_dir.parent / f"{name}.stderr"
    cmd = [sys.executable, "-m", "gwtf_node.cli", "join", "--run", str(run), "--state-dir", str(state_dir),
           "--insecure-unsigned", *args]
    with open(err, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=fh, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, err, time.monotonic()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _wait_addr(state_dir: Path, proc: subprocess.Popen, what: str) -> str:
    deadline = time.monotonic() + START_S
    addr = state_dir / "addr"
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        if addr.exists() and addr.read_text().strip():
            return addr.read_text().split()[0]
        time.sleep(0.1)
    raise AssertionError(f"{what} did not listen within {START_S:.0f} s")


def _log_time(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory):
    """A data node d0 on a fixed port; five `join`s that must fail, run at the same time; and a relay whose
    bootstrap peer d1 is started only once the relay's first attempt to reach it has failed."""
    tmp = tmp_path_factory.mktemp("startup")
    run, other_run = tmp / "run.json", tmp / "other-run.json"
    save_manifest(default_manifest(stages=1, layers=1, hidden=16, seq_len=8, microbatch_size=1,
                                   microbatches_per_iteration=1), run)
    save_manifest(default_manifest(stages=1, layers=1, hidden=16, seq_len=8, microbatch_size=1,
                                   microbatches_per_iteration=1, seed=1), other_run)
    port = free_port()
    procs: list[subprocess.Popen] = []
    plain = socket.socket()
    try:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        late_port = free_port()  # where d1 listens once the late relay has failed to reach it
        late_addr = f"/ip4/127.0.0.1/tcp/{late_port}/p2p/{peer_id_of(load_or_create_identity(tmp / 'd1'))}"
        nobody = late_addr.replace(f"/tcp/{late_port}/", f"/tcp/{free_port()}/")  # nothing ever listens there
        relay = ("--role", "relay", "--stage", "0")
        d0, d0_err, _ = _join("d0", tmp / "d0", run, "--role", "data", "--name", "d0", "--port", str(port))
        late = _join("late", tmp / "late", run, *relay, "--bootstrap", late_addr, "--bootstrap-timeout", "120")
        started = {  # first what needs no d0, then what needs d0 running
            "plain_port": _join("plain-port", tmp / "plain-port", run, *relay, "--port", str(plain.getsockname()[1])),
            "no_bootstrap": _join("no-bootstrap", tmp / "no-bootstrap", run, *relay, "--bootstrap", nobody,
                                  "--bootstrap-timeout", str(BOOTSTRAP_TIMEOUT_S)),
        }
        procs += [d0, late[0]] + [p for p, _, _ in started.values()]
        d1 = None
        addr = _wait_addr(tmp / "d0", d0, "d0")
        started |= {
            "same_port": _join("same-port", tmp / "same-port", run, *relay, "--port", str(port)),
            "locked": _join("locked", tmp / "d0", run, *relay),
            "other_run": _join("other-run", tmp / "other-run", other_run, *relay, "--bootstrap", addr),
        }
        procs += [started[n][0] for n in ("same_port", "locked", "other_run")]
        outcomes: dict[str, Outcome] = {}
        deadline = time.monotonic() + START_S + BOOTSTRAP_TIMEOUT_S + EXIT_MARGIN_S
        while len(outcomes) < len(started) and time.monotonic() < deadline:
            if d1 is None and "unreachable (Connection refused): attempt 1," in late[1].read_text():
                d1, _, _ = _join("d1", tmp / "d1", run, "--role", "data", "--name", "d1", "--port", str(late_port),
                                 "--iterations", "1")  # then it stops: no training beside the other tests
                procs.append(d1)
            for name, (proc, err, t0) in started.items():
                if name not in outcomes and proc.poll() is not None:
                    outcomes[name] = Outcome(proc.returncode, time.monotonic() - t0, err.read_text())
            time.sleep(0.05)
        assert d0.poll() is None, f"d0 died: {d0_err.read_text()[-2000:]}"
        yield SimpleNamespace(tmp=tmp, run=run, port=port, addr=addr, d0=d0, d0_err=d0_err, outcomes=outcomes,
                              procs=procs, late=late[0], late_err=late[1], d1=d1)
    finally:
        plain.close()
        for p in procs:
            _stop(p)


def _failed(swarm, name: str, rc: int = 2) -> Outcome:
    out = swarm.outcomes.get(name)
    assert out is not None, f"{name} still runs"
    assert out.rc == rc, (out.rc, out.stderr[-3000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.last_line.startswith("error: "), out.stderr[-3000:]
    return out


@processes
def test_a_second_node_on_a_nodes_port_exits_naming_the_port(swarm) -> None:
    out = _failed(swarm, "same_port")
    assert f"port {swarm.port} on 127.0.0.1 is in use" in out.last_line and "--port" in out.last_line
    assert not (swarm.tmp / "same-port" / "addr").exists()  # it never listened


@processes
def test_a_port_held_by_another_program_exits_naming_the_port(swarm) -> None:
    out = _failed(swarm, "plain_port")
    assert re.search(r"port \d+ on 127\.0\.0\.1 is in use", out.last_line)
    assert "listening on []" not in out.stderr


@processes
def test_a_locked_state_directory_exits_naming_the_holder(swarm) -> None:
    out = _failed(swarm, "locked")
    assert f"pid {swarm.d0.pid}" in out.last_line and "--state-dir" in out.last_line
    assert (swarm.tmp / "d0" / "addr").read_text().split()[0] == swarm.addr  # not overwritten


@processes
def test_a_relay_of_another_run_is_told_why_and_exits(swarm) -> None:
    out = _failed(swarm, "other_run")
    assert out.last_line.startswith("error: refused by peer 12D3KooW")
    assert "this node trains run" in out.last_line and "run.json differs" in out.last_line
    assert "Hello for run" in swarm.d0_err.read_text()  # the data node logged its refusal too


@processes
def test_an_unreachable_bootstrap_is_retried_then_given_up(swarm) -> None:
    out = _failed(swarm, "no_bootstrap", rc=3)
    assert "no bootstrap peer answered within 5 s" in out.last_line
    retries = [ln for ln in out.stderr.splitlines() if "unreachable (Connection refused): attempt" in ln]
    assert len(retries) >= 2, out.stderr[-3000:]
    gave_up = next(ln for ln in out.stderr.splitlines() if "ERROR gwtf.node: no bootstrap peer answered" in ln)
    assert _log_time(gave_up) - _log_time(retries[0]) >= BOOTSTRAP_TIMEOUT_S - 2.0  # it retried for the timeout
    status = json.loads((swarm.tmp / "no-bootstrap" / "status.json").read_text())
    assert status["bootstrap"]["state"] == "gave up" and status["bootstrap"]["attempts"] >= 2
    assert status["bootstrap"]["last_error"] == "Connection refused"


@processes
def test_a_bootstrap_peer_that_comes_up_late_is_joined_by_the_retries(swarm) -> None:
    assert swarm.d1 is not None, "the late relay logged no failed first attempt"
    deadline = time.monotonic() + START_S
    status: dict = {}
    while time.monotonic() < deadline:
        assert swarm.late.poll() is None, swarm.late_err.read_text()[-3000:]
        path = swarm.tmp / "late" / "status.json"
        status = json.loads(path.read_text()) if path.exists() else {}
        if status.get("bootstrap", {}).get("state") == "connected":
            break
        time.sleep(0.2)
    assert status["bootstrap"]["state"] == "connected", status.get("bootstrap")
    assert status["bootstrap"]["attempts"] >= 2 and status["bootstrap"]["gives_up_in_s"] is None
    assert status["bootstrap"]["last_error"] == "Connection refused"  # what the failed attempts met
    assert "joined the swarm after" in swarm.late_err.read_text()


@processes
def test_a_node_killed_with_sigkill_restarts_at_once_on_its_port_and_state_directory(swarm) -> None:
    os.killpg(swarm.d0.pid, signal.SIGKILL)
    swarm.d0.wait(timeout=10)
    (swarm.tmp / "d0" / "addr").unlink()
    again, err, _ = _join("d0-again", swarm.tmp / "d0", swarm.run, "--role", "data", "--name", "d0",
                          "--port", str(swarm.port))
    swarm.procs.append(again)
    assert _wait_addr(swarm.tmp / "d0", again, "d0 restarted") == swarm.addr  # same port, same peer id
    assert _wait_log(err, "waiting for peers"), err.read_text()[-2000:]  # it says how others reach it


def _wait_log(path: Path, needle: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in path.read_text():
            return True
        time.sleep(0.1)
    return False
