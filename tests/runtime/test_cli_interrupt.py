"""A Ctrl-C at any moment of `gwtf-node` is one line and exit status 130, never a traceback (gwtf_node/entry.py).

The child delivers SIGINT to itself from a timer thread started before the
entry point runs, so each delay lands somewhere in the same sequence (the
command line's imports, building the parsers, the node's start-up, its
event loop) whatever the machine's load.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gwtf_node.model.manifest import default_manifest, save_manifest

CHILD = """
import os, signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
from gwtf_node.entry import main
threading.Timer(float(sys.argv[1]), lambda: os.kill(os.getpid(), signal.SIGINT)).start()
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("delay", [0.02, 0.1, 0.3, 1.0, 3.0])
def test_ctrl_c_at_any_moment_of_join_is_one_line(tmp_path: Path, delay: float) -> None:
    run = tmp_path / "run.json"
    save_manifest(default_manifest(), run)
    argv = ["join", "--run", str(run), "--role", "data", "--state-dir", str(tmp_path / "d0"), "--insecure-unsigned"]
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(delay), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode in (0, 130), (proc.returncode, err)  # 0: the node caught it and stopped gracefully
    if proc.returncode == 130:
        assert err.strip().splitlines()[-1].endswith("interrupted"), err


SWALLOWED = """
import os, signal, sys, weakref
signal.signal(signal.SIGINT, signal.default_int_handler)
import gwtf_node.cli as cli
from gwtf_node.entry import main
real = cli.main


class Doomed:
    pass


def swallowed(_):  # as the import system's module locks do at the end of every import
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10000):  # the handler runs here, and Python prints and drops what a weakref callback raises
        pass


def command(argv):
    doomed = Doomed()
    ref = weakref.ref(doomed, swallowed)
    del doomed
    assert ref() is None
    return real(argv)


cli.main = command
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["join", "sim"])
def test_a_ctrl_c_that_python_swallowed_still_stops_the_command(tmp_path: Path, command: str) -> None:
    """The Ctrl-C lands in a weakref callback ("Exception ignored in ..."): `join` does not start its node, and a
    command that runs to its end exits 130 all the same."""
    run = tmp_path / "run.json"
    save_manifest(default_manifest(), run)
    argv = (["join", "--run", str(run), "--role", "data", "--state-dir", str(tmp_path / "d0"), "--insecure-unsigned"]
            if command == "join" else ["sim", "gen-flow", "--setting", "1", "--seed", "3"])
    proc = subprocess.Popen([sys.executable, "-c", SWALLOWED, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=90)  # (a node that started anyway runs until killed)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Exception ignored" in err, err  # the interrupt was swallowed where it landed
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == "interrupted", err
    assert not (tmp_path / "d0" / "node.log").exists() or "listening" not in (tmp_path / "d0" / "node.log").read_text()


def test_a_closed_pipe_ends_the_output_quietly() -> None:
    """`gwtf-node ... | head -1`: the reader leaves; no BrokenPipeError traceback."""
    proc = subprocess.run(f"{sys.executable} -m gwtf_node sim gen-flow --setting 1 --seed 3 | head -c 10",
                          shell=True, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_peer_id_in_a_directory_that_cannot_be_made_is_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "gwtf_node", "peer-id", "--state-dir", "/proc/gwtf-nowhere"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("error: cannot create the identity key in /proc/gwtf-nowhere: No such file or "
                                   "directory")


def test_a_corrupt_identity_key_is_one_line_at_join(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from gwtf_node.model.manifest import sign_manifest

    run = tmp_path / "run.json"
    save_manifest(sign_manifest(default_manifest(), Ed25519PrivateKey.generate()), run)
    (tmp_path / "d0").mkdir()
    (tmp_path / "d0" / "identity.key").write_bytes(b"garbage\n")
    proc = subprocess.run([sys.executable, "-m", "gwtf_node", "join", "--run", str(run), "--role", "relay",
                           "--state-dir", str(tmp_path / "d0")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "is corrupt" in proc.stderr


def test_a_ctrl_c_that_python_wraps_is_still_one_line(monkeypatch, capsys) -> None:
    """A Ctrl-C landing in `__set_name__` while an import defines a dataclass reaches us as a RuntimeError
    caused by the KeyboardInterrupt (Python 3.11), and a nursery gathers one into an exception group: still
    `interrupted`, 130; any other RuntimeError goes on."""
    import gwtf_node.cli as cli
    from gwtf_node.entry import main

    class Field:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    def importing(argv):
        class Schedule:  # what an import does when the Ctrl-C lands in its dataclass definition
            extra = Field()
        return 0

    monkeypatch.setattr(cli, "main", importing)
    assert main(["join"]) == 130
    assert capsys.readouterr().err == "interrupted\n"

    def gathered(argv):
        raise BaseExceptionGroup("from a nursery", [KeyboardInterrupt()])

    monkeypatch.setattr(cli, "main", gathered)
    assert main(["join"]) == 130
    assert capsys.readouterr().err == "interrupted\n"

    def failing(argv):
        raise RuntimeError("a real error")

    monkeypatch.setattr(cli, "main", failing)
    with pytest.raises(RuntimeError, match="a real error"):
        main(["join"])
