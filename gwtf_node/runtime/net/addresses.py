"""Addresses: what a node listens on, what it tells its peers, and which addresses a peer can use.

A node listens on one or more TCP endpoints (`--listen`, IPv4 or IPv6,
written as a multiaddr `/ip4/0.0.0.0/tcp/4001` or as `host:port`,
`[::]:4001`).  What it tells its peers (Hello, PeerList, its DHT record,
the `addr` file) are its *advertised* addresses:

* the `--announce` addresses, exactly, when any are given (a node behind a
  router with a forwarded port, or a public node whose interface address is
  not its public one);
* else its listen addresses, with an unspecified host (0.0.0.0, ::)
  replaced by the machine's interface addresses (loopback left out when
  there is any other), since an unspecified address means "your own
  machine" to whoever dials it.

A loopback address is never passed to a peer that is not itself on this
machine (`usable_by`): to a remote peer it names the peer's own machine.
Unspecified addresses are never passed on at all.  A peer's addresses as it
told them are checked the same way on arrival (`from_peer`): an unspecified
host is replaced by the address the connection came from (what older nodes
send), and a loopback address of a remote peer is dropped.

The tensor channel listens on the same hosts as libp2p, on its own port
(`--tensor-port`; by default the libp2p port + 1, or any free port when the
libp2p port is 0: `default_tensor_port`).  Peers learn it in the channel
handshake (channel.py); an announced node tells the first announced host
with its tensor port, so a forwarded tensor port must be the same number on
the router as on the node.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path


class AddressError(ValueError):
    """An address a person gave is not usable; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A TCP endpoint: an IP address (no brackets) and a port."""

    host: str
    port: int

    @property
    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        return ipaddress.ip_address(self.host)

    @property
    def multiaddr(self) -> str:
        return f"/ip{self.ip.version}/{self.host}/tcp/{self.port}"

    @property
    def hostport(self) -> str:
        return f"[{self.host}]:{self.port}" if self.ip.version == 6 else f"{self.host}:{self.port}"


def parse_endpoint(text: str, what: str = "address") -> Endpoint:
    """`/ip4/H/tcp/P`, `/ip6/H/tcp/P` (a trailing /p2p/<id> is ignored), `H:P` or `[H6]:P` as an Endpoint."""
    text = text.strip()
    if text.startswith("/"):
        parts = text.split("/")
        if len(parts) < 5 or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp" or (
                len(parts) > 5 and parts[5] != "p2p"):
            raise AddressError(f"{what} {text!r}: expected /ip4/<address>/tcp/<port> or /ip6/<address>/tcp/<port> "
                               "(host names are not supported: give an IP address)")
        host, port_text = parts[2], parts[4]
        want = 4 if parts[1] == "ip4" else 6
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise AddressError(f"{what} {text!r}: expected HOST:PORT, [IPv6]:PORT or a multiaddr /ip4/.../tcp/PORT")
        if host.startswith("["):
            if not host.endswith("]"):
                raise AddressError(f"{what} {text!r}: unbalanced brackets around the IPv6 address")
            host = host[1:-1]
        elif ":" in host:
            raise AddressError(f"{what} {text!r}: write an IPv6 address in brackets, [{host}]:{port_text}")
        want = None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise AddressError(f"{what} {text!r}: {host!r} is not an IPv4 or IPv6 address "
                           "(host names are not supported)") from None
    if want is not None and ip.version != want:
        raise AddressError(f"{what} {text!r}: {host} is not an IPv{want} address")
    try:
        port = int(port_text)
    except ValueError:
        raise AddressError(f"{what} {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise AddressError(f"{what} {text!r}: port {port} is outside 0..65535")
    return Endpoint(str(ip), port)


def listen_endpoints(listen, host: str = "127.0.0.1", port: int = 0) -> list[Endpoint]:
    """The `--listen` endpoints, or `host:port` (the older `--host` / `--port`) when none are given."""
    return [parse_endpoint(a, "--listen") for a in listen] or [Endpoint(str(ipaddress.ip_address(host)), port)]


def parse_announce(text: str) -> Endpoint:
    """An `--announce` address: a concrete host (not 0.0.0.0 or ::) and a port (not 0)."""
    ep = parse_endpoint(text, "--announce")
    if ep.ip.is_unspecified:
        raise AddressError(f"--announce {text!r}: {ep.host} means 'any address' and cannot be dialled: give the "
                           "address peers reach this node at (its public IP, or the router's with a forwarded port)")
    if ep.port == 0:
        raise AddressError(f"--announce {text!r}: give the port peers dial (the forwarded port, or --port)")
    return ep


def default_tensor_port(libp2p_port: int) -> int:
    """The tensor channel's port when none is given: libp2p's + 1 (0: any free port, as libp2p's)."""
    if libp2p_port == 0:
        return 0
    if libp2p_port >= 65535:
        raise AddressError(f"the tensor channel's port defaults to the libp2p port + 1, and {libp2p_port} + 1 is no "
                           "TCP port: give --tensor-port")
    return libp2p_port + 1


def interface_addresses() -> list[str]:
    """This machine's IP addresses (IPv4 by SIOCGIFADDR per interface, IPv6 from /proc/net/if_inet6)."""
    out: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                out.append(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]))  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address on this interface
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            ip = ipaddress.IPv6Address(bytes.fromhex(raw))
            if not ip.is_link_local:  # needs a scope id to be dialled
                out.append(str(ip))
    except (OSError, ValueError, IndexError):
        pass
    return out


def expand(endpoints: list[Endpoint], interfaces: list[str]) -> list[Endpoint]:
    """`endpoints` with an unspecified host replaced by the interface addresses of its family
    (loopback ones only when there is nothing else)."""
    out: list[Endpoint] = []
    for ep in endpoints:
        if not ep.ip.is_unspecified:
            out.append(ep)
            continue
        same = [ipaddress.ip_address(a) for a in interfaces]
        same = [a for a in same if a.version == ep.ip.version]
        outside = [a for a in same if not a.is_loopback]
        for a in (outside or same):
            out.append(Endpoint(str(a), ep.port))
    seen: set[Endpoint] = set()
    return [e for e in out if not (e in seen or seen.add(e))]


def advertised(candidates: list[str], announced: list[Endpoint], interfaces: list[str]) -> list[str]:
    """What a node tells its peers, from libp2p's candidates (its listen addresses, and any it observed):
    `announced` if any, else the candidates with unspecified hosts expanded (`expand`)."""
    if announced:
        return [e.multiaddr for e in announced]
    found, other = [], []
    for c in candidates:
        try:
            found.append(parse_endpoint(c))
        except AddressError:
            other.append(c)
    return [e.multiaddr for e in expand(found, interfaces)] + other


def host_of(multiaddr: str) -> str | None:
    """The IP address of an /ip4 or /ip6 multiaddr, else None."""
    parts = multiaddr.split("/")
    if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
        return parts[2]
    return None


def is_loopback_host(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def usable_by(multiaddr: str, peer_is_local: bool) -> bool:
    """Whether `multiaddr` may be given to a peer: never an unspecified host; a loopback host only to a peer
    on this machine (`peer_is_local`: its connection comes from loopback)."""
    host = host_of(multiaddr)
    if host is None:
        return "/p2p-circuit" in multiaddr or multiaddr.startswith(("/dns", "/p2p/"))
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if ip.is_unspecified:
        return False
    return peer_is_local or not ip.is_loopback


def from_peer(multiaddrs, observed_host: str | None) -> list[str]:
    """A peer's addresses as it told them, made usable from here: an unspecified host becomes the address its
    connection came from (`observed_host`), a loopback address of a peer not on this machine is dropped."""
    local = observed_host is None or is_loopback_host(observed_host)
    out: list[str] = []
    for a in multiaddrs:
        host = host_of(a)
        if host is not None and observed_host is not None:
            try:
                ip = ipaddress.ip_address(host)
            except ValueError:
                continue
            if ip.is_unspecified:
                obs = ipaddress.ip_address(observed_host)
                if obs.version != ip.version:
                    continue
                a = a.replace(f"/{host}/", f"/{observed_host}/", 1)
        if usable_by(a, local) and a not in out:
            out.append(a)
    return out


__all__ = ["AddressError", "Endpoint", "advertised", "default_tensor_port", "expand", "from_peer", "host_of",
           "interface_addresses", "is_loopback_host", "listen_endpoints", "parse_announce", "parse_endpoint",
           "usable_by"]
