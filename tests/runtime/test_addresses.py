"""Listen and announce addresses, and which addresses a peer may be given (runtime/net/addresses.py)."""

from __future__ import annotations

import pytest

from gwtf_node.runtime.net.addresses import (
    AddressError, Endpoint, default_tensor_port, expand, from_peer, listen_endpoints, parse_announce, parse_endpoint,
    usable_by,
)

PID = "12D3KooWExample"


@pytest.mark.parametrize("text, want", [
    ("0.0.0.0:4001", Endpoint("0.0.0.0", 4001)),
    ("/ip4/198.18.0.5/tcp/4001", Endpoint("198.18.0.5", 4001)),
    (f"/ip4/198.18.0.5/tcp/4001/p2p/{PID}", Endpoint("198.18.0.5", 4001)),
    ("[::]:4001", Endpoint("::", 4001)),
    ("/ip6/2001:db8::1/tcp/0", Endpoint("2001:db8::1", 0)),
    ("[2001:DB8::1]:5", Endpoint("2001:db8::1", 5)),
])
def test_endpoints_parse_from_multiaddrs_and_host_port(text, want):
    ep = parse_endpoint(text)
    assert ep == want
    assert parse_endpoint(ep.multiaddr) == ep and parse_endpoint(ep.hostport) == ep


@pytest.mark.parametrize("text, says", [
    ("example.org:4001", "not an IPv4 or IPv6"),
    ("::1:4001", "brackets"),
    ("1.2.3.4", "HOST:PORT"),
    ("1.2.3.4:70000", "outside 0..65535"),
    ("/ip4/::1/tcp/5", "not an IPv4"),
    ("/dns4/example.org/tcp/5", "host names"),
    ("1.2.3.4:x", "not a number"),
])
def test_bad_endpoints_say_why(text, says):
    with pytest.raises(AddressError, match=says):
        parse_endpoint(text)


def test_announce_needs_a_dialable_host_and_port():
    assert parse_announce("203.0.113.7:4001") == Endpoint("203.0.113.7", 4001)
    with pytest.raises(AddressError, match="any address"):
        parse_announce("0.0.0.0:4001")
    with pytest.raises(AddressError, match="port"):
        parse_announce("203.0.113.7:0")


def test_listen_defaults_to_host_and_port():
    assert listen_endpoints([], "127.0.0.1", 0) == [Endpoint("127.0.0.1", 0)]
    assert listen_endpoints(["0.0.0.0:1", "[::]:2"]) == [Endpoint("0.0.0.0", 1), Endpoint("::", 2)]


def test_tensor_port_follows_the_libp2p_port():
    assert default_tensor_port(4001) == 4002
    assert default_tensor_port(0) == 0
    with pytest.raises(AddressError, match="--tensor-port"):
        default_tensor_port(65535)


def test_unspecified_hosts_expand_to_interface_addresses_without_loopback():
    ifaces = ["127.0.0.1", "198.18.0.10", "10.1.0.2", "::1", "2001:db8::5"]
    got = expand([Endpoint("0.0.0.0", 4001), Endpoint("::", 4001), Endpoint("198.18.0.10", 4001)], ifaces)
    assert got == [Endpoint("198.18.0.10", 4001), Endpoint("10.1.0.2", 4001), Endpoint("2001:db8::5", 4001)]
    assert expand([Endpoint("0.0.0.0", 1)], ["127.0.0.1"]) == [Endpoint("127.0.0.1", 1)]  # nothing else: loopback


def test_loopback_and_unspecified_addresses_never_reach_a_remote_peer():
    lo, any4 = f"/ip4/127.0.0.1/tcp/1/p2p/{PID}", f"/ip4/0.0.0.0/tcp/1/p2p/{PID}"
    pub = f"/ip4/198.18.0.9/tcp/1/p2p/{PID}"
    assert [a for a in (lo, any4, pub) if usable_by(a, peer_is_local=False)] == [pub]
    assert [a for a in (lo, any4, pub) if usable_by(a, peer_is_local=True)] == [lo, pub]
    assert not usable_by(f"/ip6/::/tcp/1/p2p/{PID}", True)
    assert usable_by(f"/ip4/198.18.0.1/tcp/1/p2p/R/p2p-circuit/p2p/{PID}", False)


def test_a_peers_unspecified_address_becomes_where_it_came_from():
    told = [f"/ip4/0.0.0.0/tcp/4001/p2p/{PID}", f"/ip4/127.0.0.1/tcp/4001/p2p/{PID}",
            f"/ip6/::/tcp/4001/p2p/{PID}", f"/ip4/10.1.0.2/tcp/4001/p2p/{PID}"]
    assert from_peer(told, "198.18.0.21") == [f"/ip4/198.18.0.21/tcp/4001/p2p/{PID}",
                                              f"/ip4/10.1.0.2/tcp/4001/p2p/{PID}"]
    # a peer on this machine: its loopback address is ours too
    assert f"/ip4/127.0.0.1/tcp/4001/p2p/{PID}" in from_peer(told, "127.0.0.1")


def test_a_node_with_only_private_addresses_looks_natted():
    from gwtf_node.runtime.net.relay import is_circuit, looks_natted

    assert looks_natted([f"/ip4/10.1.0.2/tcp/4001/p2p/{PID}", f"/ip4/192.168.1.5/tcp/4001/p2p/{PID}"])
    assert looks_natted([f"/ip4/100.64.3.4/tcp/1/p2p/{PID}", f"/ip6/fd00::5/tcp/1/p2p/{PID}"])  # CGNAT, ULA
    assert not looks_natted([f"/ip4/10.1.0.2/tcp/1/p2p/{PID}", f"/ip4/198.18.0.10/tcp/1/p2p/{PID}"])
    assert not looks_natted([f"/ip4/127.0.0.1/tcp/1/p2p/{PID}"])  # a swarm on one machine needs no relay
    assert not looks_natted([])
    assert is_circuit(f"/ip4/198.18.0.10/tcp/1/p2p/R/p2p-circuit/p2p/{PID}") and not is_circuit("/ip4/1.2.3.4/tcp/1")
