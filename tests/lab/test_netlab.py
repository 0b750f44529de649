"""The network lab itself (gwtf_node/testing/netlab.py): NAT, reachability, partitions, cleanup."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import labutil
from support.labutil import unavailable

from gwtf_node.testing.netlab import NetLab, leftover_namespaces

pytestmark = pytest.mark.netlab
lab = labutil.lab  # the fixture

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5000)); s.listen()
print("listening", flush=True)
while True:
    c, addr = s.accept()
    print(addr[0], addr[1], flush=True)
    c.sendall(b"hi"); c.close()
"""
CLIENT = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    print(s.getsockname()[1], s.recv(2).decode())
except OSError as e:
    print("FAIL", type(e).__name__); sys.exit(1)
"""


def serve(lab, node):
    proc = lab.popen(node, [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    return proc


def dial(lab, node, ip, port=5000, timeout=1.5):
    return lab.run(node, [sys.executable, "-c", CLIENT, ip, str(port), str(timeout)], timeout=30)


def test_home_node_reaches_public_node_which_sees_the_router(lab):
    pub = lab.public("p")
    home = lab.home("a")
    srv = serve(lab, pub)
    out = dial(lab, home.hosts[0], pub.ip)
    assert out.returncode == 0, out.stdout + out.stderr
    local_port, greeting = out.stdout.split()
    assert greeting == "hi"
    seen_ip, seen_port = srv.stdout.readline().split()
    assert seen_ip == home.wan_ip != home.hosts[0].ip  # the router's address, not the host's
    assert seen_port == local_port  # the NAT keeps the source port (what hole punching relies on)


def test_public_node_cannot_dial_a_home_node(lab):
    pub = lab.public("p")
    home = lab.home("a")
    serve(lab, home.hosts[0])
    assert dial(lab, pub, home.wan_ip).stdout.startswith("FAIL")  # unsolicited inbound is dropped
    assert dial(lab, pub, home.hosts[0].ip).stdout.startswith("FAIL")  # private address: no route
    assert dial(lab, home.hosts[0], "127.0.0.1").returncode == 0  # the server does listen


def test_two_homes_cannot_dial_each_other(lab):
    a, b = lab.home("a"), lab.home("b")
    serve(lab, b.hosts[0])
    assert dial(lab, a.hosts[0], b.wan_ip).stdout.startswith("FAIL")


def test_partition_cuts_traffic_and_restore_brings_it_back(lab):
    pub = lab.public("p")
    home = lab.home("a")
    serve(lab, pub)
    host = home.hosts[0]
    assert dial(lab, host, pub.ip).returncode == 0
    lab.cut(host)
    assert dial(lab, host, pub.ip).stdout.startswith("FAIL")
    lab.restore(host)
    assert dial(lab, host, pub.ip).returncode == 0
    lab.cut(home.wan)  # the whole home
    assert dial(lab, host, pub.ip).stdout.startswith("FAIL")
    lab.restore(home.wan)
    assert dial(lab, host, pub.ip).returncode == 0


def test_shaped_link_still_carries_traffic(lab):
    pub = lab.public("p")
    serve(lab, pub)
    q = lab.public("q")
    lab.shape(q, 5)
    assert "tbf" in subprocess.run(["tc", "-n", q.ns, "qdisc", "show", "dev", "eth0"], capture_output=True,
                                   text=True).stdout
    assert dial(lab, q, pub.ip).returncode == 0
    lab.unshape(q)


def test_everything_is_removed_also_on_failure():
    why = unavailable()
    if why is not None:
        pytest.skip(f"network lab: {why}")
    prefix = None
    with pytest.raises(KeyboardInterrupt):
        with NetLab() as made:
            prefix = made.prefix
            node = made.public("p")
            proc = made.popen(node, [sys.executable, "-c", "import time; time.sleep(600)"])
            raise KeyboardInterrupt
    assert proc.poll() is not None  # its process is gone
    assert not leftover_namespaces(prefix)


FORKED = """
import socket, sys
from gwtf_node.runtime.local.zygote import serve

def run(argv):  # what each forked child does: dial argv[0]:5000 and write what it saw to argv[1]
    try:
        s = socket.create_connection((argv[0], 5000), timeout=5)
        got = s.recv(2).decode()
    except OSError as e:
        got = f"FAIL {type(e).__name__}"
    with open(argv[1], "w") as f:
        f.write(got + " " + " ".join(name for _, name in socket.if_nameindex()))
    return 0

sys.exit(serve(run))
"""


def test_a_child_of_the_fork_server_runs_in_its_namespace(lab, tmp_path):
    """LocalSwarm(netns=...) forks a lab node from the one fork server: the child enters the namespace itself
    (zygote.enter_netns), and from there reaches a public node as a process started by `ip netns exec` does."""
    from gwtf_node.runtime.local.zygote import Zygote

    pub, other = lab.public("p"), lab.public("q")
    srv = serve(lab, pub)
    z = Zygote([sys.executable, "-c", FORKED])
    try:
        out = tmp_path / "out"
        child = z.spawn([pub.ip, str(out)], {"PATH": "/usr/bin:/bin"}, tmp_path / "log", tmp_path / "exit",
                        netns=other.ns)
        assert child.wait(timeout=30) == 0, (tmp_path / "log").read_text()
        got = out.read_text().split()
        assert got[0] == "hi", got
        assert "lo" in got and len(got) == 3, got  # the namespace's loopback and its one veth, not the host's
        seen_ip, _ = srv.stdout.readline().split()
        assert seen_ip == other.ip
        bad = z.spawn([pub.ip, str(out)], {}, tmp_path / "log2", tmp_path / "exit2", netns="no-such-namespace")
        assert bad.wait(timeout=30) == 1
        assert "No such file or directory" in (tmp_path / "log2").read_text()
    finally:
        z.close()
