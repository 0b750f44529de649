"""A network lab in Linux network namespaces: an "internet", home networks behind NAT routers, shaped links.

Why: every other test of the daemon runs on loopback, where every node can
dial every other.  A volunteer on a home GPU sits behind a NAT router that
drops unsolicited inbound connections; this lab makes that situation on one
machine so that the daemon's reachability code (announced addresses, the
tensor channel falling back to the libp2p connection, relays) can be tested
for real.  It needs root and the `ip`, `tc` and `nft` commands (Debian
packages iproute2 and nftables); `lab_unavailable()` says in one line why a
lab cannot be made here, and tests skip with that line.

Topology (all inside namespaces whose names start with the lab's unique
prefix, so concurrent labs never collide and nothing touches the host's own
network):

    <prefix>-net        the internet: bridge `br0` (no address of its own)
      <prefix>-<name>   a public node: `eth0` = 198.18.0.<n>/15 on the bridge
      <prefix>-<home>   a NAT router: `wan` = 198.18.0.<n>/15 on the bridge,
                        `lan<i>` = 10.<h>.<i>.1/24 towards each of its hosts;
                        nftables masquerade on `wan` (port-preserving, which is
                        what the kernel does unless told `random`: `random_ports`
                        makes such a router), forward and
                        input policy drop except established/related and what
                        comes from the LAN: unsolicited inbound is dropped, as by
                        a home router
        <prefix>-<home>-<i>  a host at home: `eth0` = 10.<h>.<i>.2/24, default
                        route via its router

Addresses come from 198.18.0.0/15, the benchmarking range (RFC 2544), and
from 10/8 behind the routers; nothing is routed to the host's own network.

Links: every node's uplink is a veth pair (public node <-> bridge, home host
<-> its router, router WAN <-> bridge).  `shape(node, rate_mbit)` puts a
`tbf` qdisc on both ends of a node's uplink (this kernel has no netem, so
latency belongs to the daemon's own link emulation); `cut(node)` sets both
ends down (a partition: packets are dropped, open TCP connections stall)
and `restore(node)` sets them up again.

Processes: `popen(node, argv)` starts `ip netns exec <ns> argv` in its own
process group and remembers it.  On exit of the `with` block, normal or by an
exception or KeyboardInterrupt, and also when building the lab fails half
way, every remembered process group is sent SIGTERM then SIGKILL, every
process still inside one of the lab's namespaces (`ip netns pids`) is killed,
and every namespace is deleted, which removes its veths.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Sequence

INTERNET = ipaddress.ip_network("198.18.0.0/15")  # benchmarking range: never routed on the real internet
STOP_GRACE_S = 3.0  # SIGTERM first, then SIGKILL after this
COMMAND_TIMEOUT_S = 20.0  # one `ip` / `nft` / `tc` call
REQUIRED_COMMANDS = ("ip", "tc", "nft")

ROUTER_RULES = """
table ip nat {{
  chain post {{ type nat hook postrouting priority 100; oifname "wan" masquerade{random}; }}
}}
table inet filter {{
  chain fw_chain {{ type filter hook forward priority 0; policy drop;
    ct state established,related accept; iifname "lan*" oifname "wan" accept; {lan_to_lan}}}
  chain in_chain {{ type filter hook input priority 0; policy drop;
    ct state established,related accept; iifname "lo" accept; iifname "lan*" accept; }}
}}
"""  # nft: a chain may not be called `fwd` (a keyword)


class LabError(RuntimeError):
    """The lab could not be built or changed; the message names the command and its output."""


def lab_unavailable() -> str | None:
    """Why network namespaces cannot be made here (one line), or None when they can."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the lab tests as root)"
    missing = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    if missing:
        return f"the lab needs the commands {', '.join(missing)} (Debian packages iproute2, nftables)"
    name = f"gwprobe{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(argv)} did not finish in {COMMAND_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass
class Node:
    """A namespace with one uplink: a public node, a home host or (for `wan`) a router."""

    name: str
    ns: str
    ip: str  # its own address: public for a public node, 10.x behind a router
    link: tuple[tuple[str, str], tuple[str, str]]  # (namespace, device) of both ends of its uplink
    public_ip: str  # what the internet sees: its own address, or its router's WAN address
    home: Home | None = None

    def __str__(self) -> str:
        return f"{self.name} ({self.ip} in {self.ns})"


@dataclass
class Home:
    """A NAT router and the hosts behind it."""

    name: str
    router_ns: str
    wan_ip: str
    wan: Node  # the router's uplink to the internet (cut it to cut the whole home off)
    hosts: list[Node] = field(default_factory=list)


class NetLab:
    """A lab of namespaces; use as a context manager (everything is removed on exit)."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or f"gwl{os.getpid() % 100000}{uuid.uuid4().hex[:4]}"
        self.net_ns = f"{self.prefix}-net"
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.nodes: dict[str, Node] = {}
        self.homes: dict[str, Home] = {}
        self._next_public = 10  # 198.18.0.10 onwards
        self._next_port = 0  # bridge-side veth number

    # ---- building --------------------------------------------------------------

    def __enter__(self) -> NetLab:
        try:
            self._add_ns(self.net_ns)
            _run(["ip", "-n", self.net_ns, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.net_ns, "link", "set", "br0", "up"])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _public_ip(self) -> str:
        ip = str(INTERNET.network_address + self._next_public)
        self._next_public += 1
        return ip

    def _attach(self, ns: str, dev: str, ip: str) -> tuple[tuple[str, str], tuple[str, str]]:
        """A veth from the bridge to `dev` in `ns` with address `ip`; both ends."""
        self._next_port += 1
        port = f"p{self._next_port}"
        _run(["ip", "link", "add", port, "netns", self.net_ns, "type", "veth", "peer", "name", dev, "netns", ns])
        _run(["ip", "-n", self.net_ns, "link", "set", port, "master", "br0", "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{ip}/{INTERNET.prefixlen}", "dev", dev])
        _run(["ip", "-n", ns, "link", "set", dev, "up"])
        return (ns, dev), (self.net_ns, port)

    def public(self, name: str) -> Node:
        """A node with a public address on the internet (`<prefix>-<name>`)."""
        self._check_name(name)
        ns = f"{self.prefix}-{name}"
        self._add_ns(ns)
        ip = self._public_ip()
        link = self._attach(ns, "eth0", ip)
        node = Node(name, ns, ip, link, ip)
        self.nodes[name] = node
        return node

    def home(self, name: str, hosts: int = 1, *, lan_to_lan: bool = True, random_ports: bool = False) -> Home:
        """A NAT router `<prefix>-<name>` and `hosts` hosts behind it, named `<name>-<i>`; `random_ports`: the
        router picks a random source port for each outgoing connection (`masquerade random`, as some routers
        and carrier NATs do), which defeats TCP hole punching."""
        self._check_name(name)
        index = len(self.homes) + 1
        router = f"{self.prefix}-{name}"
        self._add_ns(router)
        wan_ip = self._public_ip()
        wan_link = self._attach(router, "wan", wan_ip)
        _run(["ip", "netns", "exec", router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        wan = Node(f"{name}-wan", router, wan_ip, wan_link, wan_ip)
        home = Home(name, router, wan_ip, wan)
        for i in range(hosts):
            host = f"{name}-{i}"
            ns = f"{self.prefix}-{host}"
            self._add_ns(ns)
            lan = f"lan{i}"
            _run(["ip", "link", "add", lan, "netns", router, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "-n", router, "addr", "add", f"10.{index}.{i}.1/24", "dev", lan])
            _run(["ip", "-n", router, "link", "set", lan, "up"])
            ip = f"10.{index}.{i}.2"
            _run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "route", "add", "default", "via", f"10.{index}.{i}.1"])
            node = Node(host, ns, ip, ((ns, "eth0"), (router, lan)), wan_ip, home)
            home.hosts.append(node)
            self.nodes[host] = node
        rules = ROUTER_RULES.format(lan_to_lan='iifname "lan*" oifname "lan*" accept; ' if lan_to_lan else "",
                                    random=" random" if random_ports else "")
        _run(["ip", "netns", "exec", router, "nft", "-f", "-"], stdin=rules)
        self.homes[name] = home
        self.nodes[wan.name] = wan
        return home

    def _check_name(self, name: str) -> None:
        if not name or not all(c.isalnum() for c in name) or name == "net" or name in self.nodes:
            raise LabError(f"lab node name {name!r}: letters and digits, not 'net', not used before")

    # ---- links -------------------------------------------------------------------

    def shape(self, node: Node | str, rate_mbit: float, burst_kbit: int = 64) -> None:
        """Cap both directions of `node`'s uplink at `rate_mbit` (tbf); again to change it."""
        node = self._node(node)
        for ns, dev in node.link:
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                  "burst", f"{burst_kbit}kbit", "latency", "400ms"])

    def unshape(self, node: Node | str) -> None:
        node = self._node(node)
        for ns, dev in node.link:
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True)

    def firewall(self, node: Node | str) -> None:
        """Drop every new inbound connection to `node` (a public node behind a firewall: it dials out, nobody dials
        in; its own connections' replies pass)."""
        node = self._node(node)
        _run(["ip", "netns", "exec", node.ns, "nft", "-f", "-"], stdin="add table inet gwtf_fw\n"
             "add chain inet gwtf_fw input { type filter hook input priority 0; policy accept; }\n"
             "add rule inet gwtf_fw input ct state established,related accept\n"
             "add rule inet gwtf_fw input iifname lo accept\n"
             "add rule inet gwtf_fw input ct state new drop\n")

    def cut(self, node: Node | str) -> None:
        """Partition `node` (a router's `<home>-wan`: the whole home) from the rest: its uplink goes down."""
        for ns, dev in self._node(node).link:
            _run(["ip", "-n", ns, "link", "set", dev, "down"])

    def restore(self, node: Node | str) -> None:
        node = self._node(node)
        for ns, dev in node.link:
            _run(["ip", "-n", ns, "link", "set", dev, "up"])
        if node.home is not None:  # the host's default route went with its link
            gw = node.ip.rsplit(".", 1)[0] + ".1"
            subprocess.run(["ip", "-n", node.ns, "route", "replace", "default", "via", gw], capture_output=True)

    def _node(self, node: Node | str) -> Node:
        if isinstance(node, Node):
            return node
        try:
            return self.nodes[node]
        except KeyError:
            raise LabError(f"no lab node {node!r} (have: {', '.join(sorted(self.nodes))})") from None

    # ---- processes ---------------------------------------------------------------

    def argv(self, node: Node | str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside `node`'s namespace."""
        return ["ip", "netns", "exec", self._node(node).ns, *argv]

    def popen(self, node: Node | str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start `argv` inside `node`'s namespace in its own process group; stopped when the lab closes."""
        proc = subprocess.Popen(self.argv(node, argv), start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def run(self, node: Node | str, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run `argv` inside `node`'s namespace to its end (bounded by `timeout`)."""
        return subprocess.run(self.argv(node, argv), capture_output=True, text=True, timeout=timeout)

    # ---- teardown -----------------------------------------------------------------

    def close(self) -> None:
        """Stop every process and delete every namespace of the lab (safe to call twice)."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                p.wait()
        self.procs.clear()
        for ns in reversed(self.namespaces):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:  # anything else still inside a namespace of ours is ours too
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()


def leftover_namespaces(prefix: str) -> list[str]:
    """Namespaces whose name starts with `prefix` (a test checks that a lab leaves none)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


__all__ = ["Home", "INTERNET", "LabError", "NetLab", "Node", "lab_unavailable", "leftover_namespaces"]
