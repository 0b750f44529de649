"""The daemon's driver of the protocol machines (`protocol/driver.py`): frames, timers and work, per machine.

Theory of operation
-------------------
Each component owns its machines and carries out their effects itself,
`driver.carry(effects, handlers)` (`protocol.driver.carry_out`), with one `MachineDriver` per machine
and its own handlers for the effects only it knows; nothing goes out to the
node and back.  A driver sends through the wire, one task per message, or,
for a machine whose messages to a peer must keep their order (the recovery
and flow machines), in batches (`in_order`: the batch ends with `flush`):
one task per peer and batch, or, where the machine assumes FIFO links (`fifo`:
the flow machines), through an `Outbox`, which sends a peer's batches in the
order they were flushed, one task per peer at a time (trio may start two tasks
in either order).  A component may send through a function of its own (the
aggregation stamps BEGIN with the term it leads, the microbatches attach the
tensors).  `compute` starts the component's worker as a task: only the
microbatches' driver has one.

`Drivers` holds the node's timers: one task (`Timers.loop`) fires every
deadline, keyed by (`Owner`, key), so that two machines may use the same key;
a due timer goes to the driver of its owner, which hands the key back to its
component's `on_timer`.  A timer set again under the same key replaces the
earlier one.
"""

from __future__ import annotations

import enum
from typing import Any, Awaitable, Callable

import trio

from ...protocol.driver import Handlers, UnknownEffect, carry_out
from ...protocol.effects import TimerKey
from ...protocol.recovery import Compute
from ..net.wire import Wire


class Owner(enum.Enum):
    """The machine a driver carries out effects of, and whose timers it keys."""

    FLOWS = "flows"  # the flow machine (protocol/flow/)
    POOLING = "pooling"  # pooled formation's machines (protocol/flow/pool.py, pooling.py)
    SCALING = "scaling"  # scaled formation's machine (protocol/flow/scaling.py, scaled.py; scaledformation.py)
    MICROBATCHES = "microbatches"  # the recovery machine (protocol/recovery/)
    AGGREGATION = "aggregation"  # the phases (protocol/phases.py)
    LEADER = "leader"  # the election (protocol/leader.py)
    PLACEMENT = "placement"  # the acting leader's placement of joiners (protocol/membership.py)
    JOINER = "joiner"  # a --stage auto relay's joiner machine (protocol/membership.py)


class Timers:
    """Deadlines keyed by (component, key); a timer set again under the same key replaces the earlier one."""

    def __init__(self, fire: Callable[[Owner, TimerKey], None]) -> None:
        self.fire = fire
        self.deadlines: dict[tuple[Owner, TimerKey], float] = {}
        self.wake = trio.Event()

    def set(self, key: tuple[Owner, TimerKey], deadline: float) -> None:
        self.deadlines[key] = deadline
        self.wake.set()

    def cancel(self, key: tuple[Owner, TimerKey]) -> None:
        self.deadlines.pop(key, None)

    async def loop(self) -> None:
        while True:
            self.wake = trio.Event()
            if self.deadlines:
                key = min(self.deadlines, key=self.deadlines.get)
                deadline = self.deadlines[key]
                with trio.move_on_at(deadline):
                    await self.wake.wait()
                    continue
                if self.deadlines.get(key) == deadline:
                    del self.deadlines[key]
                    self.fire(*key)
            else:
                await self.wake.wait()


Send1 = Callable[[str, Any], Awaitable[Any]]  # one message to one peer
SendBatch = Callable[[str, list], Awaitable[Any]]  # a peer's messages, in order (Outbox: how many went)


RESEND_FIRST_S = 0.5  # an `Outbox` sends what failed again after this long, ...
RESEND_MAX_S = 8.0  # ... twice as long after each failure in a row, up to this


class Outbox:
    """Messages to each peer sent in the order they were put, by one task per peer at a time (FIFO links).

    Reliable as well as in order: `send_batch` returns how many of a batch went out before the first that failed
    (None: all), and the rest go again at the head of the peer's queue after `RESEND_FIRST_S`, doubling up to
    `RESEND_MAX_S` while sends keep failing (a connection that failed: the next send dials anew), until the peer
    is gone (presumed dead or left: the machine forgets it, and its queue is dropped).  In one run of 100 daemons
    on two cores, 27 label announcements and 7 link costs failed to send; a flow machine that misses one keeps a
    label or a cost that is no longer true."""

    def __init__(self, wire: Wire, send_batch: SendBatch) -> None:
        self.wire, self._send = wire, send_batch
        self.queued: dict[str, list] = {}  # peer -> messages not handed to the wire yet, in order
        self.sending: set[str] = set()  # peers a `_drain` task sends to now
        self.resent = 0  # messages sent again after a send failed

    def put(self, peer: str, msgs: list) -> None:
        """Queue `msgs` to `peer` after what is queued there; `start` sends them."""
        self.queued.setdefault(peer, []).extend(msgs)

    def start(self) -> None:
        """A sending task for every peer with queued messages and none sending to it yet."""
        for peer in [p for p, msgs in self.queued.items() if msgs and p not in self.sending]:
            self.sending.add(peer)
            self.wire.spawn(self._drain, peer)

    async def _drain(self, peer: str) -> None:
        wait = RESEND_FIRST_S
        try:
            while self.queued.get(peer):
                batch = self.queued.pop(peer)
                went = await self._send(peer, batch)
                if went is None or went >= len(batch):
                    wait = RESEND_FIRST_S
                    continue
                if self.wire.peers.is_gone(peer):
                    self.queued.pop(peer, None)
                    return
                self.queued[peer] = batch[went:] + self.queued.get(peer, [])
                self.resent += len(batch) - went
                await trio.sleep(wait)
                wait = min(2.0 * wait, RESEND_MAX_S)
        finally:
            self.sending.discard(peer)


class MachineDriver:
    """The `protocol.driver.Driver` of one machine of the daemon (module docstring)."""

    def __init__(self, wire: Wire, timers: Timers, owner: Owner, on_timer: Callable[[TimerKey], None], *,
                 send: Send1 | None = None, in_order: SendBatch | None = None, fifo: bool = False,
                 compute: Callable[[Compute], Awaitable[None]] | None = None) -> None:
        self.wire, self.timers, self.owner, self.on_timer = wire, timers, owner, on_timer
        self._send = send if send is not None else wire.send
        self._in_order = in_order
        self._compute = compute
        self._held: dict[str, list] = {}  # peer -> messages held until `flush` (in_order)
        self.outbox = Outbox(wire, in_order) if fifo and in_order is not None else None

    def carry(self, effects: list, own: Handlers | None = None) -> None:
        """Carry out the machine's `effects`, those only the component knows through `own` (`carry_out`)."""
        carry_out(self, effects, own, what=f"the {self.owner.value} machine")

    def send(self, to: str, msg: Any) -> None:
        if self._in_order is not None:
            self._held.setdefault(to, []).append(msg)
        else:
            self.wire.spawn(self._send, to, msg)

    def set_timer(self, key: TimerKey, deadline: float) -> None:
        self.timers.set((self.owner, key), deadline)

    def cancel_timer(self, key: TimerKey) -> None:
        self.timers.cancel((self.owner, key))

    def compute(self, e: Compute) -> None:
        if self._compute is None:
            raise UnknownEffect(f"the {self.owner.value} machine returned {e!r}: it has no worker")
        self.wire.spawn(self._compute, e)

    def flush(self) -> None:
        held, self._held = self._held, {}
        if self.outbox is not None:  # a peer's batches in order, one task per peer at a time
            for peer, msgs in held.items():
                self.outbox.put(peer, msgs)
            self.outbox.start()
            return
        for peer, msgs in held.items():  # one task per peer and batch, its messages in order
            self.wire.spawn(self._in_order, peer, msgs)


class Drivers:
    """The node's machine drivers and the timers they share (module docstring)."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.timers = Timers(self.fire)
        self.by_owner: dict[Owner, MachineDriver] = {}

    def make(self, owner: Owner, on_timer: Callable[[TimerKey], None], **how: Any) -> MachineDriver:
        """The driver of `owner`'s machine: its timers go to `on_timer`; `how`: `MachineDriver`'s options."""
        d = self.by_owner[owner] = MachineDriver(self.wire, self.timers, owner, on_timer, **how)
        return d

    def fire(self, owner: Owner, key: TimerKey) -> None:
        d = self.by_owner.get(owner)
        if d is None:
            raise UnknownEffect(f"a timer {key!r} of the {owner.value} machine is due: no component handles it")
        d.on_timer(key)
