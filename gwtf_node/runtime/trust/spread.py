"""Revocation lists passed on: a node that adopts a newer list of the run owner tells its peers.

`gwtf-node revoke --publish-to` stores the owner's signed revocation list in
the DHT, where the nodes read it (discovery.py: from their own copy of the
DHT every round, over the network every `REVOCATIONS_EVERY_S`).  Beside
that, a node that adopts a newer list (from `--revocations FILE`, the DHT or
a peer; authorize.py `take_revocations`) sends it to every peer it knows
(`Revocations`), and a peer that says Hello gets the list this node holds
unless it was sent that one already: a list crosses each link once and
reaches every node of the connected swarm within a few round trips, the
nodes that were away included, without a walk of the DHT per node.

The receiver checks the owner's signature, so the message is taken from
anyone (routes.py).  The same bytes as the list held here are dropped before
any check (a node hears a new list from each of its peers); a list that is
not the owner's, or not for this run, is refused like a bad frame (counted
as BAD_RECORD, and a peer that keeps sending such is banned: wire.py); a
list not newer than the one held changes nothing.  A run without an owner
key has no revocation: the message is dropped.
"""

from __future__ import annotations

import logging
from typing import Any

from ...model.certificates import AdmissionError
from ...protocol import messages as m
from ...protocol.bounds import MAX_REVOCATIONS_BYTES

log = logging.getLogger("gwtf.node")


class RevocationSpread:
    def __init__(self, authorizer: Any, wire: Any, peers: Any) -> None:
        self.authorizer = authorizer  # authorize.py Authorizer: checks and holds the list
        self.wire = wire
        self.peers = peers
        self._told: dict[str, int] = {}  # peer -> `issued` of the list sent to it or heard from it
        authorizer.on_adopted = self._adopted

    @property
    def _held(self) -> tuple[bytes, int] | None:
        raw = self.authorizer.revocations_raw
        if raw is None or len(raw) > MAX_REVOCATIONS_BYTES:  # (a longer list is read from the DHT or a file only)
            return None
        return raw, self.authorizer.revocations_issued

    def _tell(self, peer: str) -> None:
        held = self._held
        if held is None or self._told.get(peer) == held[1] or peer == self.wire.me:
            return
        self._told[peer] = held[1]
        self.wire.post(peer, m.Revocations(held[0]))

    def _adopted(self, source: str | None) -> None:
        """The authorizer took a newer list (from peer `source`, or None): every other peer gets it."""
        if source is not None:
            self._told[source] = self.authorizer.revocations_issued
        for peer in self.peers.ids_known():
            self._tell(peer)

    def on_peer_hello(self, peer: str) -> None:
        """A peer said Hello (a newcomer, one back, or a place that changed): the list held here, once."""
        self._tell(peer)

    def peer_forgotten(self, peer: str) -> None:
        """A peer gone or presumed dead: if it comes back it may have restarted without the list."""
        self._told.pop(peer, None)

    def on_revocations(self, sender: str, msg: m.Revocations) -> None:
        a = self.authorizer
        if a.insecure:
            log.debug("revocation list from %s dropped: this run has no owner key", self.peers.who(sender))
            return
        if msg.signed == a.revocations_raw:  # the list held here: nothing to check again
            self._told[sender] = a.revocations_issued
            return
        try:
            a.take_revocations(bytes(msg.signed), f"peer {self.peers.who(sender)}", source=sender)
        except AdmissionError as e:
            self.wire.refuse(sender, f"a revocation list the run owner did not sign for this run: {e}",
                             m.RefusalCode.BAD_RECORD)
