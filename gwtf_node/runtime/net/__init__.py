"""Reaching peers: identity, addresses, the libp2p host, the tensor channel, link emulation, relay, hole punching,
the peer table, discovery, bootstrap and the wire every component is handed.

Imports only `ops/` of the runtime.
"""
