"""The listening side of a host's start (host.py `open_host`): ports, the libp2p host, the tensor listeners.

A port given (not 0) that something already listens on raises `PortInUse`
before anything starts (startup.py says why py-libp2p's SO_REUSEPORT needs
this probe): `probe_ports`.  The libp2p host is pinned to Noise and Yamux,
with the identity key of the state directory, and advertises the announced
addresses, or the listen ones with 0.0.0.0 / :: expanded to this machine's
interface addresses (addresses.py): `new_libp2p_host`.  py-libp2p logs a
failed listen and runs on, listening on nothing: `check_listening` turns that
into an error.  The tensor channel listens on the libp2p listen hosts, all on
one port: `open_tensor_listeners`.

Yamux as py-libp2p 0.8.1 ships it answers every read of a stream with a
window update (`PY_YAMUX_RELEASE_ON_READ`, on by default), each one an
encrypted write.  `new_libp2p_host` turns that off (`YAMUX_ENV`), installs
go-yamux's rule (yamuxwin.py: an update once half the window was read), and
control frames are read in chunks (frames.py `Buffered`): no window update
per frame where there were 2, and 0.52 x the CPU per frame and its answer
(`python scripts/bench_ctrl_frames.py`).

Whom a node dials is the daemon's choice (discovery.py, bounded fan-out),
not py-libp2p's connection manager's.  As shipped, py-libp2p 0.8.1 dials
peers of its peerstore on its own while a node holds fewer than 200
connections (its AutoConnector: every 10-30 s and after each disconnect, up
to 32 dials at a time; from a node without a public address, every peer with
an address), prunes connections above 300 (its ConnectionPruner) and
refuses them past 1,000 (its resource manager), where a data node works with
every relay of the swarm.  `new_libp2p_host` raises the pruning mark and the
limits to `MAX_CONNECTIONS`, and `own_connections` stops the AutoConnector
once the host runs.  The DHT's walks still leave connections open to the
peers they asked (status.json `connections`: 40-49 of the 49 other nodes of
a 50-daemon swarm, against 19-21 in the node's table).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.rcmgr import ResourceLimits, new_resource_manager
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from multiaddr import Multiaddr

from . import yamuxwin
from .addresses import Endpoint, advertised, interface_addresses
from .identity import load_or_create_identity
from ..ops.startup import PortInUse, StartupError, check_port_free


def probe_ports(eps: list[Endpoint], tensor_hosts: list[str], tensor_port: int) -> None:
    """Raise `PortInUse` if a given port of the libp2p endpoints or of the tensor channel is taken."""
    for e in eps:
        check_port_free(e.host, e.port)
    for h in tensor_hosts:
        check_port_free(h, tensor_port, "tensor channel port", "choose another --tensor-port")


MAX_CONNECTIONS = 16384  # py-libp2p's pruning mark and limits (module doc): above any swarm's fan-out
MAX_STREAMS = 8 * MAX_CONNECTIONS  # ... streams open at once (control, payload, tensor handshakes, DHT)
YAMUX_ENV = {"PY_YAMUX_RELEASE_ON_READ": "0"}  # window updates when yamux's hysteresis asks (module doc)


def new_libp2p_host(state_dir: Path, eps: list[Endpoint], announced: list[Endpoint]) -> IHost:
    """The libp2p host (not running yet) of the state directory's identity: Noise, Yamux, advertised addresses."""
    for name, value in YAMUX_ENV.items():  # (read by yamux at each read; an operator's own setting wins)
        os.environ.setdefault(name, value)
    yamuxwin.install()
    interfaces = interface_addresses() if any(e.ip.is_unspecified for e in eps) else []

    def advertise(candidates: list[Multiaddr]) -> list[Multiaddr]:
        return [Multiaddr(a) for a in advertised([str(c) for c in candidates], announced, interfaces)]

    key_pair = load_or_create_identity(Path(state_dir))
    noise_key = create_new_x25519_key_pair()
    return new_host(
        key_pair=key_pair,
        sec_opt={TProtocol(NOISE_PROTOCOL_ID): NoiseTransport(key_pair, noise_privkey=noise_key.private_key)},
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
        addrs_factory=advertise,
        connection_config=connection_config(),
        resource_manager=new_resource_manager(limits=ResourceLimits(max_connections=MAX_CONNECTIONS,
                                                                    max_streams=MAX_STREAMS)),
    )


def connection_config() -> ConnectionConfig:
    """py-libp2p's connection manager with nothing to do (module doc): no floor to dial up to, no pruning below
    `MAX_CONNECTIONS`."""
    return ConnectionConfig(max_connections=MAX_CONNECTIONS, high_watermark=MAX_CONNECTIONS, low_watermark=0,
                            min_connections=0)


async def own_connections(lp: IHost) -> None:
    """Stop py-libp2p's AutoConnector of the running host `lp` (module doc): it dials no peer of its own."""
    await lp.get_network().auto_connector.stop()


def check_listening(lp: IHost, eps: list[Endpoint]) -> None:
    """Raise if the running libp2p host listens on no address (a port taken since the probe, or a bad address)."""
    if not lp.get_transport_addrs():  # py-libp2p logs a failed listen and runs on, listening on nothing
        busy = next((e for e in eps if e.port), None)
        if busy is not None:
            raise PortInUse(busy.host, busy.port)  # taken between the probe and libp2p's bind
        raise StartupError(f"libp2p could not listen on {', '.join(e.hostport for e in eps)} (see the log "
                           "above): check --listen")


async def open_tensor_listeners(hosts: list[str], port: int) -> tuple[list[trio.SocketListener], int]:
    """TCP listeners of the tensor channel on `hosts`, all on one port (`port`, or the first one's if 0); that port."""
    listeners: list[trio.SocketListener] = []
    for h in hosts:
        try:
            listeners += await trio.open_tcp_listeners(port, host=h)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(h, port, "tensor channel port", "choose another --tensor-port") from None
            raise
        port = listeners[0].socket.getsockname()[1]  # (port 0: the others take the first one's number)
    return listeners, port
