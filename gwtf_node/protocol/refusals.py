"""Why a node refused a frame: the codes a `Refused` answer carries and a node counts (status.json "refused");
and `Revocations`, the run owner's list of peers no longer admitted, as nodes pass it on (trust/spread.py).

Kept beside `messages.py` (which re-exports both) so that the message module stays within its size; each
value mirrors the proto enum `RefusalCode` and its comment.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RefusalCode(enum.IntEnum):
    """Why a node refused a frame (a Hello, or any message); mirrors the proto enum `RefusalCode`."""

    OTHER_RUN = 1  # "I train another run: your run.json is not the swarm's."
    NO_SUCH_ROLE = 2  # "A node is a data node or a relay; your Hello says neither."
    NO_SUCH_STAGE = 3  # "The stage your Hello names does not exist in this run."
    INVALID = 4  # "Your frame is malformed or makes no sense here now (the reason says why)."
    NOT_ADMITTED = 5  # "This run admits that role by certificate only, and you showed none."
    BAD_CERTIFICATE = 6  # "Your certificate is not the run owner's for this run, peer id and role."
    CERTIFICATE_EXPIRED = 7  # "Your certificate has expired: ask the run owner for a new one."
    REVOKED = 8  # "The run owner revoked your admission."
    WRONG_ROLE = 9  # "Only an admitted data node may send that message."
    NOT_LEADER = 10  # "Only the leader of the current term (or the phase's upstream) sends that."
    NOT_NEIGHBOUR = 11  # "Only a flow neighbour (adjacent stage) sends that, and you are not one."
    UNKNOWN_PEER = 12  # "Say Hello first: I do not know you."
    BANNED = 13  # "You sent too many refused frames: disconnected and banned for a while."
    BAD_RECORD = 14  # "Your DHT record is not signed by a peer that may write its key."


@dataclass(frozen=True, slots=True)
class Revocations:
    signed: bytes  # the run owner's signed revocation list (model/certificates.py RevocationList.to_bytes)
