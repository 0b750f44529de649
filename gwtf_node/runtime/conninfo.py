"""What a py-libp2p host knows about its connection to a peer: where it comes from, and which kind it is.

Kinds (the status shows one per neighbour):

* "direct": we dialled the peer's address;
* "inbound": the peer dialled us, the only way to reach a peer behind NAT
  (its router drops connections from outside, so every stream to it rides
  on the connection it opened);
* "relayed": the connection goes through a circuit relay (`/p2p-circuit`
  in its transport address).
"""

from __future__ import annotations

from libp2p.abc import IHost
from libp2p.peer.id import ID


def connections(lp: IHost, peer_id: str) -> list:
    try:
        return list(lp.get_network().connections.get(ID.from_base58(peer_id), ()))
    except ValueError:
        return []


def remote_host(lp: IHost, peer_id: str) -> str | None:
    """The IP address `peer_id`'s connection comes from, if connected."""
    for c in connections(lp, peer_id):
        try:
            remote = c.muxed_conn.get_remote_address()
        except (AttributeError, OSError):
            continue
        if remote:
            return str(remote[0])
    return None


def connection_kind(lp: IHost, peer_id: str) -> str | None:
    """"direct", "inbound" or "relayed" (the best of the peer's connections, in that order), or None."""
    kinds = set()
    for c in connections(lp, peer_id):
        try:
            addrs = [str(a) for a in c.get_transport_addresses()]
        except (AttributeError, OSError):
            addrs = []
        if any("/p2p-circuit" in a for a in addrs):
            kinds.add("relayed")
        else:
            kinds.add("direct" if getattr(c.muxed_conn, "is_initiator_value", False) else "inbound")
    return next((k for k in ("direct", "inbound", "relayed") if k in kinds), None)


__all__ = ["connection_kind", "connections", "remote_host"]
