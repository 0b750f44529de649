"""Circuit relay v2: how two nodes behind different NAT routers reach each other (py-libp2p 0.8.1).

A home router drops connections from outside, so two nodes behind two such
routers cannot dial each other.  A public node that runs the relay service
(`--relay-service`) forwards a connection between them: each NATed node
keeps a connection to it and a *reservation* there (a slot the relay keeps
for it), and advertises the address
`/ip4/<relay>/tcp/<port>/p2p/<relay>/p2p-circuit/p2p/<itself>`; a peer
that cannot dial it directly dials that address and gets a connection
through the relay, end-to-end encrypted (Noise) and multiplexed (Yamux) as
any other.  Tensors to a peer reached that way go over that connection
(host.py: the tensor channel cannot be dialled through a relay).

What the library does and what is ours (../shared/notes/py-libp2p-nat.md):

* `CircuitV2Protocol` serves the relay (HOP) and accepts relayed
  connections (STOP); `CircuitV2Transport.reserve` makes and refreshes a
  reservation, `.dial` opens a relayed connection.  Used as they are.
* The library's relay takes 4 reservations, 1 GiB and 1 h per circuit by
  default: `RELAY_LIMITS` sizes them for a run.
* Ours: a node reserves only when it looks unreachable (`looks_natted`:
  all its advertised addresses are private: RFC 1918, CGNAT 100.64/10, IPv6
  ULA) or a dial-back said it is (dialback.py: a node with a public address
  asks the first peer it reaches directly to dial it back; behind a firewall
  it then reserves, and advertises only its relayed addresses), on each peer
  it dials until it holds `MAX_RESERVATIONS`, and a peer
  without the relay service just refuses the protocol; the relayed address
  is published by us (py-libp2p's `get_addrs()` never lists it), and
  `host.connect` dials circuit addresses itself (the swarm refuses them:
  "All addresses ... are unusable").  `transport.reserve` leaves the HOP
  stream open: it is closed here.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable

import trio
from libp2p.abc import IHost
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2 import CircuitV2Protocol, CircuitV2Transport, RelayLimits
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from . import dialback
from .addresses import host_of, is_loopback_host
from .holepunch import HolePunching

log = logging.getLogger("gwtf.transport")

RELAY_LIMITS = RelayLimits(
    duration=24 * 3600,  # a circuit lives a day (library: 1 h), the length of a long run's session
    data=1 << 40,  # 1 TiB per circuit (library: 1 GiB, which a stage's activations pass in minutes)
    max_circuit_conns=64,  # circuits per reservation: one per peer that dials the reserved node
    max_reservations=1024,  # nodes behind NAT one relay serves (library: 4, for the whole relay)
)
MAX_RESERVATIONS = 2  # relays a NATed node holds a slot on (a second one in case the first leaves)
RESERVE_TIMEOUT_S = 10.0
CIRCUIT_DIAL_TIMEOUT_S = 15.0
_PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                                              "fc00::/7")]


def looks_natted(addrs: list[str]) -> bool:
    """Whether every advertised address is a private one (a home LAN, a carrier's NAT): nobody outside can
    dial it, so the node needs a relay.  Loopback-only nodes (a test swarm on one machine) need none."""
    ips = []
    for a in addrs:
        host = host_of(a)
        if host is None:
            continue
        try:
            ips.append(ipaddress.ip_address(host))
        except ValueError:
            continue
    return bool(ips) and all(any(ip in net for net in _PRIVATE if net.version == ip.version) for ip in ips)


def routable(addrs: list[str]) -> bool:
    """Whether any advertised address is not loopback (a node on a network, not a test swarm on one machine)."""
    return any(h is not None and not is_loopback_host(h) for h in map(host_of, addrs))


def tcp_port(addrs: list[str]) -> int | None:
    """The TCP port of the first direct advertised address."""
    for a in addrs:
        if not is_circuit(a):
            try:
                return int(Multiaddr(a).value_for_protocol("tcp"))
            except Exception:  # noqa: BLE001 - no tcp component (the library raises several types)
                continue
    return None


def is_circuit(multiaddr: str) -> bool:
    return "/p2p-circuit" in multiaddr


class Relaying:
    """The circuit relay of one host: the service (if `serve`), reservations and relayed dials."""

    def __init__(self, lp: IHost, serve: bool, on_addrs_changed: Callable[[], None] = lambda: None,
                 on_upgraded: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.lp = lp
        self.serve = serve
        self.protocol = CircuitV2Protocol(lp, limits=RELAY_LIMITS if serve else None, allow_hop=serve)
        roles = RelayRole.STOP | RelayRole.CLIENT | (RelayRole.HOP if serve else RelayRole(0))
        self.transport = CircuitV2Transport(lp, self.protocol, RelayConfig(roles=roles, limits=RELAY_LIMITS))
        self.on_addrs_changed = on_addrs_changed
        self.on_upgraded = on_upgraded  # a hole punch replaced the relayed connection to this peer (holepunch.py)
        self.holepunch: HolePunching | None = None  # started with the first reservation: the node needs a relay
        self.circuit_addrs: list[str] = []  # ours, through the relays we hold a reservation on
        self.reserved: dict[str, str] = {}  # relay peer id -> its address we reached
        self.reachable: bool | None = None  # the dial-back's answer (dialback.py); None: not known
        self.reachable_by: str | None = None  # the peer that answered it
        self._met: dict[str, str] = {}  # peers reached directly -> the address (relays to reserve on, if need be)
        self._asking = False
        self._tried: set[str] = set()
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the relay protocol (HOP if serving, STOP always) until cancelled."""
        async with background_trio_service(self.protocol), trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def met(self, peer_id: str, addr: str, advertised: list[str], direct: bool = True) -> None:
        """We dialled `peer_id` at `addr`: if this node looks unreachable, try a reservation there; a node with a
        public address that does not know yet asks it for a dial-back (dialback.py)."""
        if self._nursery is None or is_circuit(addr) or not direct:
            return
        self._met[peer_id] = addr
        self.greeted(peer_id, advertised)
        if looks_natted(advertised) or self.reachable is False:
            self._reserve_on(peer_id, addr)

    def greeted(self, peer_id: str, advertised: list[str]) -> None:
        """A peer we reached or that said Hello (maybe over a connection it opened): a node with a public address
        that has not asked yet asks it for a dial-back, so a node that never dials out (the swarm's bootstrap)
        learns it too."""
        if self._nursery is None or self.reachable is not None or self._asking or looks_natted(advertised) \
                or not routable(advertised):
            return
        port = tcp_port(advertised)
        if port is not None:
            self._asking = True
            self._nursery.start_soon(self._dial_back, peer_id, port)

    def _reserve_on(self, peer_id: str, addr: str) -> None:
        if peer_id in self.reserved or peer_id in self._tried or len(self.reserved) >= MAX_RESERVATIONS:
            return
        self._tried.add(peer_id)
        self._nursery.start_soon(self._reserve, peer_id, addr)

    async def _dial_back(self, peer_id: str, port: int) -> None:
        try:
            answer = await dialback.check(self.lp, peer_id, port)
        finally:
            self._asking = False
        if answer is None:
            return  # (the next peer met is asked)
        self.reachable, self.reachable_by = answer, peer_id
        if answer:
            log.info("reachable from outside: %s dialled this node back at port %d", peer_id, port)
            return
        log.warning("not reachable from outside at port %d (a firewall?): reserving a slot on relays, advertising "
                    "only relayed addresses", port)
        for pid, addr in list(self._met.items()):
            self._reserve_on(pid, addr)

    async def _reserve(self, peer_id: str, addr: str) -> None:
        pid = ID.from_base58(peer_id)
        ok = False
        with trio.move_on_after(RESERVE_TIMEOUT_S):
            try:
                stream = await self.lp.new_stream(pid, [TProtocol(HOP_PROTOCOL_ID)])
            except Exception as e:  # noqa: BLE001 - not a relay: protocol refused (libp2p raises several types)
                log.debug("%s offers no relay service: %r", peer_id, e)
                return
            try:
                ok = await self.transport.reserve(stream, pid, self._nursery)
            finally:
                with trio.move_on_after(1):
                    try:
                        await stream.close()
                    except Exception:  # noqa: BLE001 - closing a stream the relay may have closed
                        pass
        if not ok:
            log.info("relay %s refused a reservation (or did not answer in %.0f s)", peer_id, RESERVE_TIMEOUT_S)
            return
        base = addr if "/p2p/" in addr else f"{addr}/p2p/{peer_id}"
        self.reserved[peer_id] = base
        me = self.lp.get_id().to_base58()
        self.circuit_addrs.append(f"{base}/p2p-circuit/p2p/{me}")
        log.info("reserved a slot on relay %s: peers behind other routers reach this node at %s", peer_id,
                 self.circuit_addrs[-1])
        if self.holepunch is None and self.on_upgraded is not None:
            self.holepunch = HolePunching(self.lp, self.on_upgraded)
            await self._nursery.start(self.holepunch.run)
        self.on_addrs_changed()

    async def dial(self, circuit_addr: str) -> None:
        """A relayed connection to the peer of `circuit_addr` (raises what the transport raises)."""
        with trio.fail_after(CIRCUIT_DIAL_TIMEOUT_S):
            await self.transport.dial(Multiaddr(circuit_addr))


__all__ = ["MAX_RESERVATIONS", "RELAY_LIMITS", "Relaying", "is_circuit", "looks_natted", "routable"]
