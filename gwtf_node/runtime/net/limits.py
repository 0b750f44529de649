"""Per-peer bounds on what a peer can make a node hold: connections, control streams, tensor sessions.

A node uses one libp2p connection, one control stream per direction and one
tensor channel per peer; a break reopens each once, and a redial may overlap
the old connection while it closes: twice the need, and a little more, is
never reached by an honest peer.  py-libp2p's resource manager
(`libp2p.rcmgr`, 0.8.1, installed by default) bounds connections and streams
in total only: its per-peer `ConnectionLimits` are not consulted by the swarm
when a connection is added, so the per-peer bounds are ours (host.py applies
the stream and session bounds; `ConnectionBound` the connection bound).
`ConnectionLoss` tells the node when a peer's last connection closes.
A peer that keeps sending refused frames is banned (wire.py).
"""

from __future__ import annotations

import logging
from typing import Callable

import trio
from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from multiaddr import Multiaddr

log = logging.getLogger("gwtf.transport")

MAX_CONNECTIONS_PER_PEER = 4  # established libp2p connections per peer; a newer one is closed
MAX_CTRL_STREAMS_PER_PEER = 4  # incoming control streams read at once per peer; another is reset at once
MAX_PENDING_SESSIONS_PER_PEER = 4  # tensor-channel handshakes awaiting their connection per peer; the oldest goes


class _Notifee(INotifee):
    """A libp2p notifee that does nothing: a subclass overrides what it listens to."""

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        pass

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass


class ConnectionBound(_Notifee):
    """Closes a peer's newest libp2p connection beyond `MAX_CONNECTIONS_PER_PEER`."""

    def __init__(self, limit: int = MAX_CONNECTIONS_PER_PEER) -> None:
        self.limit = limit
        self.closed = 0

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        peer = conn.muxed_conn.peer_id
        if len(network.get_connections(peer)) > self.limit:
            self.closed += 1
            log.warning("connection from %s closed: it has %d open already", peer, self.limit)
            with trio.move_on_after(1):
                try:
                    await conn.close()
                except Exception:  # noqa: BLE001 - the connection is going anyway
                    pass


class ConnectionLoss(_Notifee):
    """Tells `on_lost(peer id)` when a peer's last libp2p connection closes: a peer whose process ended closes its
    connections, and its watchers then watch it closely (runtime/node/liveness.py, `connection_lost`); and
    `on_back(peer id)` when a connection to it opens again (its process answered a handshake: it lives)."""

    def __init__(self, on_lost: Callable[[str], None], on_back: Callable[[str], None] | None = None) -> None:
        self.on_lost = on_lost
        self.on_back = on_back

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        if self.on_back is not None:
            self.on_back(conn.muxed_conn.peer_id.to_base58())

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer = conn.muxed_conn.peer_id
        if not network.get_connections(peer):
            self.on_lost(peer.to_base58())
