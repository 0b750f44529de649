"""Reachability in the network lab: a node behind NAT and a public one exchange tensors.

The home node dials the public one (its router lets that out); the public
node cannot dial the home node's tensor channel (the router drops the SYN),
so its payload goes over the libp2p connection the home node opened; the
home node's payload goes over the public node's tensor channel.  Both sides
advertise their interface addresses, never 0.0.0.0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import labutil
import pytest

pytestmark = [pytest.mark.netlab, pytest.mark.multiprocess, pytest.mark.slow]
lab = labutil.lab  # the fixture

HERE = Path(__file__).resolve().parents[1] / "support"


def _line(proc: subprocess.Popen, what: str) -> dict:
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        raise AssertionError(f"{what} exited ({proc.returncode}) without output:\n{proc.stderr.read()[-3000:]}")
    return json.loads(line)


def test_public_node_reaches_a_node_behind_nat_over_its_own_connection(lab, tmp_path):
    pub = lab.public("p")
    home = lab.home("a")
    env_cmd = [sys.executable, str(HERE / "lab_host.py")]
    p = lab.popen(pub, [*env_cmd, str(tmp_path / "p"), "0.0.0.0:4001"], stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, text=True)
    p_info = _line(p, "the public host")
    assert p_info["addrs"] == [f"/ip4/{pub.ip}/tcp/4001/p2p/{p_info['peer_id']}"]  # 0.0.0.0 expanded
    a = lab.popen(home.hosts[0], [*env_cmd, str(tmp_path / "a"), "0.0.0.0:4001", p_info["addrs"][0]],
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    a_info = _line(a, "the home host")
    assert a_info["addrs"] == [f"/ip4/{home.hosts[0].ip}/tcp/4001/p2p/{a_info['peer_id']}"]
    assert a_info["tensor"] == "0.0.0.0:4002"  # the libp2p port + 1

    a_done, p_done = _line(a, "the home host"), _line(p, "the public host")
    assert a_done == {"kind": "direct", "path": "channel", "intact": True, "hello_addrs": a_info["addrs"]}
    assert p_done == {"kind": "inbound", "path": "libp2p", "intact": True, "hello_addrs": p_info["addrs"]}
    assert a.wait(timeout=30) == 0 and p.wait(timeout=30) == 0

