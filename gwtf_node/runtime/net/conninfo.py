"""What a py-libp2p host knows about its connection to a peer: where it comes from, and which kind it is.

Kinds (the status shows one per neighbour):

* "direct": we dialled the peer's address;
* "inbound": the peer dialled us, the only way to reach a peer behind NAT
  (its router drops connections from outside, so every stream to it rides
  on the connection it opened);
* "relayed": the connection goes through a circuit relay (`/p2p-circuit`
  in its transport address);
* "hole-punched": a direct connection made by DCUtR to replace a relayed
  one (holepunch.py), whichever side's SYN made it.

With several connections to one peer the best kind is shown, in the order
above but with "hole-punched" before "inbound" and "relayed": it is the one
new streams take (py-libp2p prefers direct connections).
"""

from __future__ import annotations

from collections.abc import Callable

from libp2p.abc import IHost
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.id import ID

from ...errors import exception_chain
from .addresses import host_of, is_loopback_host


def connections(lp: IHost, peer_id: str) -> list:
    try:
        return list(lp.get_network().connections.get(ID.from_base58(peer_id), ()))
    except ValueError:
        return []


def remote_host(lp: IHost, peer_id: str) -> str | None:
    """The IP address `peer_id`'s connection comes from, if connected (a direct one's before a relayed one's,
    which is the relay's)."""
    for c in sorted(connections(lp, peer_id), key=is_relayed):
        ip = _peer_ip(c)
        if ip is not None:
            return ip
    return None


def _peer_ip(conn) -> str | None:
    """py-libp2p's `get_remote_address()` returns None for IPv6 (it expects a 2-tuple from `getpeername()`,
    which gives 4 for IPv6): then walk down to the socket (secure session -> Noise reader-writer -> raw
    connection -> TCP stream -> trio stream -> socket)."""
    try:
        remote = conn.muxed_conn.get_remote_address()
    except (AttributeError, OSError):
        remote = None
    if remote:
        return str(remote[0])
    obj = getattr(conn.muxed_conn, "secured_conn", None)
    for _depth in range(8):
        if obj is None:
            return None
        sock = getattr(obj, "socket", None)
        if sock is not None and hasattr(sock, "getpeername"):
            try:
                return str(sock.getpeername()[0]).split("%", 1)[0]
            except OSError:
                return None
        obj = next((getattr(obj, a) for a in ("conn", "read_writer", "read_write_closer", "stream")
                    if getattr(obj, a, None) is not None), None)
    return None


KINDS = ("direct", "hole-punched", "inbound", "relayed")  # best first


def is_relayed(conn) -> bool:
    """Whether a libp2p connection goes through a circuit relay (`/p2p-circuit` in its transport address)."""
    try:
        return any("/p2p-circuit" in str(a) for a in conn.get_transport_addresses())
    except (AttributeError, OSError):
        return False


def kind_of(conn, punched: Callable[[object], bool] = lambda c: False) -> str:
    """The kind of one libp2p connection; `punched(conn)`: whether a hole punch made it."""
    if is_relayed(conn):
        return "relayed"
    if punched(conn):
        return "hole-punched"
    return "direct" if getattr(conn.muxed_conn, "is_initiator_value", False) else "inbound"


def best_kind(kinds) -> str | None:
    """The best of `kinds` (`KINDS` order), or None if there is none."""
    kinds = set(kinds)
    return next((k for k in KINDS if k in kinds), None)


def connection_kind(lp: IHost, peer_id: str) -> str | None:
    """"direct", "hole-punched", "inbound" or "relayed" (the best of the peer's connections), or None.  The
    hole punching service registers itself on the host (`_dcutr_protocol`, py-libp2p's own hook)."""
    dcutr = getattr(lp, "_dcutr_protocol", None)
    punched = getattr(getattr(dcutr, "owner", None), "is_punched", lambda c: False)
    return best_kind(kind_of(c, punched) for c in connections(lp, peer_id))


class HostConnections:
    """What a host knows of its connection to each peer (a base class of host.Host, which sets `libp2p` and
    the payload paths: `_tensor_out`, `_payload_out`, `_direct_blocked_until`)."""

    libp2p: IHost
    _tensor_out: dict
    _payload_out: dict
    _direct_blocked_until: dict

    def remote_host(self, peer_id: str) -> str | None:
        """The IP address `peer_id`'s connection comes from (its router's, behind NAT), if connected."""
        return remote_host(self.libp2p, peer_id)

    def peer_is_local(self, peer_id: str) -> bool:
        """Whether `peer_id` is on this machine (its connection comes from loopback); True when unknown."""
        host = self.remote_host(peer_id)
        return host is None or is_loopback_host(host)

    def _no_channel(self, peer_id: str) -> bool:
        """`peer_id` is reached through a relay or a hole punch (both ends behind NAT), or dialled us from an
        address it does not advertise (its router's): its tensor channel cannot be dialled, so do not wait
        `DIRECT_DIAL_TIMEOUT_S` to find out."""
        kind = self.connection_kind(peer_id)
        if kind != "inbound":
            return kind in ("relayed", "hole-punched")
        remote = self.remote_host(peer_id)
        try:
            told = {host_of(str(a)) for a in self.libp2p.get_peerstore().addrs(ID.from_base58(peer_id))}
        except (KeyError, ValueError, BaseLibp2pError):  # (PeerStoreError: not identified yet)
            return False
        told.discard(None)
        return remote is not None and bool(told) and remote not in told and not is_loopback_host(remote)

    def connection_kind(self, peer_id: str) -> str | None:
        """"direct", "hole-punched", "inbound", "relayed" or None: how we are connected to `peer_id`."""
        return connection_kind(self.libp2p, peer_id)

    def payload_path(self, peer_id: str) -> str | None:
        """How payload frames go to `peer_id`: "channel" (the tensor channel), "libp2p" (its connection), or
        None (none sent yet)."""
        if peer_id in self._tensor_out:
            return "channel"
        if peer_id in self._payload_out or peer_id in self._direct_blocked_until:
            return "libp2p"
        return None


def causes(exc: BaseException, limit: int = 4) -> str:
    """`exc` and what raised it, outermost first ("A('...') <- B('...')"): py-libp2p wraps why a stream did not
    open ("Failed to create stream") around the connection's own error."""
    return " <- ".join(repr(e)[:200] for e in exception_chain(exc)[:limit])


__all__ = ["KINDS", "HostConnections", "best_kind", "causes", "exception_chain", "connection_kind", "connections", "is_relayed", "kind_of",
           "remote_host"]
