"""Where every message type is handled, and from whom it is taken: the node's dispatch table.

`routes` maps each message type to the component that handles it (`Route`):
its handler, whether the sender must have said Hello (`Admit`), whether the
handler takes the frame's raw payload (a tensor), and what the sender must
be (`Needs`, checked by authorize.py before the handler runs).  `Node` builds
the table once from its parts and `Node._on_frame` reads it for every frame.

A handler refuses a frame by raising `FrameRefused` (the peer is told why).
Anything else it raises is a fault of this node, not of the peer
(`handler_fault`): logged with its traceback, counted (status.json
`handler_faults`), the frame dropped, and the node runs on.
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from ...protocol import messages as m
from ...protocol.scalemsgs import SCALE_MESSAGES
from ..trust.authorize import Needs
from .faults import RAISE_FAULTS_ENV
from .flows import FLOW_MSGS
from .leadership import LEADER_MSGS, PLACEMENT_MSGS
from .microbatches import MB_MSGS

log = logging.getLogger("gwtf.node")



class Admit(enum.Enum):
    """From whom a message type is taken."""

    ANYONE = "anyone"  # even a peer that has not said Hello, or is gone (addresses, round trips)
    NOT_GONE = "not gone"  # a peer that has not said Hello yet, unless it is gone (it may overtake its Hello)
    KNOWN = "known"  # a peer that said Hello


@dataclass(frozen=True)
class Route:
    component: str
    handler: Callable[..., Any]  # handler(peer, msg[, payload]); may be a coroutine function
    admit: Admit = Admit.KNOWN
    payload: bool = False  # the handler takes the frame's raw payload (a tensor)
    needs: Needs = Needs.NOTHING  # what its sender must be (authorize.py); checked before the handler runs



def routes(p: Any) -> dict[type, Route]:
    """Where every message type is handled: one line per type (or family of types), read top to bottom.

    `p` is the node's `Parts` (node.py): its components.
    """
    d, lv, f, mb, ag, ld, j = p.discovery, p.liveness, p.flows, p.microbatches, p.aggregation, p.leadership, p.joining
    table: dict[type, Route] = {
        m.Hello: Route("discovery", d.on_hello, Admit.ANYONE, needs=Needs.ADMISSION),
        m.PeerList: Route("discovery", d.on_peer_list, Admit.ANYONE),  # addresses only: harmless from anyone
        # the run owner's signature is checked (spread.py): taken from anyone
        m.Revocations: Route("spread", p.spread.on_revocations, Admit.ANYONE),
        m.Ping: Route("liveness", lv.on_ping, Admit.ANYONE),
        m.Pong: Route("liveness", lv.on_pong, Admit.ANYONE),  # (the link meter's too: Liveness.exchange)
        m.LinkProbe: Route("flows", f.meter.on_probe, payload=True),
        m.LinkCost: Route("flows", f.on_link_cost, Admit.NOT_GONE),  # may overtake the sender's Hello
        m.PoolFrame: Route("flows", f.on_pool_frame),  # pooled formation: its checks are pooling.py's
        **{t: Route("flows", f.on_scale_message) for t in SCALE_MESSAGES},  # scaled formation (scaledformation.py)
        m.AllReduceChunk: Route("aggregation", ag.on_chunk, payload=True),
        m.IterationDone: Route("aggregation", ag.on_iteration_done, needs=Needs.DATA),
        m.BeginAggregation: Route("aggregation", ag.on_begin, needs=Needs.UPSTREAM),
        m.CanTake: Route("aggregation", ag.on_can_take),
        m.PhaseAck: Route("aggregation", ag.on_ack),
        m.UtilizationQuery: Route("joining", j.on_utilization_query, needs=Needs.LEADER),
        m.Assignment: Route("joining", j.on_assignment, needs=Needs.LEADER),
        m.Goodbye: Route("joining", j.on_goodbye),
        m.StageStateRequest: Route("joining", j.on_state_request),
        m.StageState: Route("joining", j.on_state, payload=True),
        m.Refused: Route("bootstrap", p.bootstrap.on_refused, Admit.ANYONE),  # the refuser has not said Hello
    }
    table |= {t: Route("flows", f.on_message, needs=Needs.NEIGHBOUR) for t in FLOW_MSGS}
    table |= {t: Route("microbatches", mb.on_message, payload=True,
                       needs=Needs.DATA if t is m.Lend else Needs.PLACED) for t in MB_MSGS}
    election_needs = {m.LeaderHeartbeat: Needs.LEADER, m.RequestVote: Needs.DATA}  # Vote, HeartbeatAck: a voter
    table |= {t: Route("leadership", ld.on_leader_msg, needs=election_needs.get(t, Needs.VOTER)) for t in LEADER_MSGS}
    table |= {t: Route("leadership", ld.on_placement_msg) for t in PLACEMENT_MSGS}
    return table


def handler_fault(component: str, msg: Any, who: str, faults: dict[str, int]) -> None:
    """Called in the `except` of a handler that raised something other than `FrameRefused`: the node's state did
    not expect the frame (a bug here, not the peer's doing).  Logged with its traceback, counted by message type in
    `faults`, the frame dropped; the node runs on (a data node that stopped on one stopped the whole run's
    training).  With `RAISE_FAULTS_ENV` set the fault is raised again, so that a test sees it."""
    if os.environ.get(RAISE_FAULTS_ENV):
        raise  # noqa: PLE0704 - re-raises the handled exception (called in an except block)
    kind = type(msg).__name__
    faults[kind] = faults.get(kind, 0) + 1
    log.exception("%s from %s: its handling in %s failed (a fault of this node): the frame is dropped, the node "
                  "runs on", kind, who, component)
