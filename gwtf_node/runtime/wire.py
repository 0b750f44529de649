"""What every component of the daemon is handed: sending frames, starting tasks, the clock, refusals.

`Wire` owns no protocol state.  It sends a message (envelope encoded by
`protocol.codec`, optional raw payload) to a peer through the host, never to
a peer that is gone (except Hello and Goodbye), logs and counts refused
frames, and starts tasks in the node's nursery.  A send that fails is logged
and reported as False: the protocol machines have their own deadlines for
lost messages.

`Owner` names the components whose machines set timers and return effects;
the node keys its timers by (owner, key) and routes effects by owner.
"""

from __future__ import annotations

import enum
import logging
from typing import Any, Awaitable, Callable

import trio

from ..protocol import codec
from ..protocol import messages as m
from .peers import Peers

log = logging.getLogger("gwtf.node")


class FrameRefused(Exception):
    """A frame that is well formed but not acceptable here; logged and dropped."""


class UnknownEffect(RuntimeError):
    """A machine returned an effect that no component handles: our own bug, never dropped silently."""


class Owner(enum.Enum):
    """The component a machine's effects and timers belong to."""

    FLOWS = "flows"  # the flow machine (protocol/flow.py)
    MICROBATCHES = "microbatches"  # the recovery machine (protocol/recovery.py)
    AGGREGATION = "aggregation"  # the phases (protocol/pipeline.py)
    LEADER = "leader"  # the election (protocol/leader.py)
    PLACEMENT = "placement"  # the acting leader's placement of joiners (protocol/membership.py)
    JOINER = "joiner"  # a --stage auto relay's joiner machine (protocol/membership.py)


ApplyEffects = Callable[[Owner, list], None]


def now() -> float:
    return trio.current_time()


class Wire:
    def __init__(self, me: str, host: Any, nursery: trio.Nursery, peers: Peers) -> None:
        self.me = me
        self.host = host
        self.nursery = nursery
        self.peers = peers
        self.refused = 0

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self.nursery.start_soon(fn, *args)

    async def send(self, peer: str, msg: m.Message, payload: bytes | memoryview = b"") -> bool:
        if self.peers.is_gone(peer) and not isinstance(msg, (m.Hello, m.Goodbye)):
            log.debug("%s to %s, which is gone: not sent", type(msg).__name__, peer[:16])
            return False
        try:
            await self.host.send(peer, codec.encode(self.me, msg), payload)
            return True
        except Exception as e:  # noqa: BLE001 - a dead or unreachable peer: logged, protocol deals with it
            log.warning("send %s to %s failed: %s", type(msg).__name__, self.peers.who(peer), e)
            return False

    def post(self, peer: str, msg: m.Message) -> None:
        """Send in a task of its own (the caller does not wait)."""
        self.nursery.start_soon(self.send, peer, msg)

    async def send_all(self, peer: str, msgs: list) -> None:
        for msg in msgs:  # in order: a Hello before what depends on it
            await self.send(peer, msg)

    async def send_tensor(self, peer: str, msg: Any, tensor, *, kept: int | None = None) -> bool:
        """`msg` with `tensor` after it: dense, or its Top-K of `kept` elements (model/compression.py)."""
        from dataclasses import replace

        from ..model.tensors import pack, pack_topk

        header, payload = pack(tensor) if kept is None else pack_topk(tensor, kept)
        return await self.send(peer, replace(msg, tensor=header), payload)

    def refuse(self, peer: str, why: str) -> None:
        self.refused += 1
        log.warning("refused frame from %s: %s", self.peers.who(peer), why)
