"""Within-stage all-reduce: the sum of a flat float32 vector over the relays of one stage.

Used in the aggregation phase (GWTF section V-E): the relays of a stage sum
their gradients (and their microbatch counts, so that each can divide by the
total) and then apply the same optimizer step.  The invariant of DESIGN.md
needs every relay to end with *bit-identical* sums, so the order of the float
additions must not depend on who answered first.

Algorithm (reduce-scatter, then all-gather; each peer sends and receives
about 2(n-1)/n of the vector, the bandwidth-optimal schedule):

1. `group` is sorted by peer id; the vector of length L is cut into n parts,
   part i = [i*L//n, (i+1)*L//n), owned by group[i].
2. Phase 1 (reduce): every peer sends part i of its vector to group[i], with
   its own `count`.
3. The owner, once it holds all n contributions, adds them in sorted-peer-id
   order (`acc = c[g0].clone(); acc += c[g1]; ...`), and sums the counts the
   same way.
4. Phase 2 (gather): the owner sends its summed part, with the total count,
   to every other peer.  Everybody copies the owner's bytes, so the result
   is identical everywhere, the owner included.

Chunks travel as `AllReduceChunk(key, part, phase, count, tensor)` frames with the raw bytes as payload (the tensor
channel), in the round's wire dtype: float32, or bfloat16 (`wire="bfloat16"`, a run's `train.wire_dtype = bf16`: half
the bytes). In a bfloat16 round every contribution is rounded to bfloat16 once, the owner's own too, the owner adds
them in float32 in the same order, and rounds the sum to bfloat16 before it sends it and before it keeps it: the
result is still identical on every member, the owner included. They may arrive before `all_reduce(key, ...)` is called
here (a faster peer): they are buffered per key (at most `MAX_PENDING_KEYS` keys; chunks of a finished key are
dropped). Each chunk is checked: the round's dtype, 1-D, nbytes matching the payload and the part's length, finite
values, sender in the group, the right owner for the phase; a bad chunk is logged on "gwtf.transport" and ignored (a
peer that only sends bad chunks shows up in the timeout error). A round times out `timeout` seconds after payload
bytes last came from another member, or went to one in this round's first sends (`Host.payload_moved`: a part of
hundreds of MB on a home uplink takes minutes, and is not lost; parts sent again do not count, or a live member that
never sends its sum would hold the round forever), raising `AllReduceTimeout` naming the peers whose parts are
missing. A member whose chunks come for another round of the same stage and iteration (another group: its view of who
is alive differs) once this round has run its resend wait is in that round: its bytes are that round's, and hold this
one no longer (`_elsewhere`; otherwise two rounds of a split stage, each resending its parts to the other, held each
other open for good). A chunk that cannot be sent is sent again until the round's timeout (`SEND_RETRY_FIRST_S`), one
lost after its send is asked for again (`_resend_missing`: not while bytes move with its owner); a member that is gone
is the caller's to see (liveness): it cancels the round and retries without it.

Threads. Everything that touches a whole part runs in a worker thread (`trio.to_thread`, one at a time per
`AllReducer`): copying a received payload and checking that it is finite in the pass that takes the squared norm the
guard judges (chunkcheck.py), the sum, and assembling the result. A part of a large model is hundreds of MB; done in
the event loop's thread, this work kept the node from answering its peers' pings for seconds (liveness.py,
looplag.py). The tensors are the round's own (a received buffer, the caller's vector, read only), so no stage lock
is needed; the order of the additions is the same as in one thread. A received payload under `INLINE_CHECK_BYTES` is
checked in the event loop instead.

Outliers (protocol/gradguard.py): before summing its part, the owner judges
every contribution to it (its count against `max_count`, the microbatches of
the iteration, and its per-microbatch size against the recent ones) and sums
only those it accepts; a refused one is logged and counted
(`outliers_refused`).  Each part then carries its own count (the phase-2
count), and where the counts of the parts differ every part is scaled to the
smallest positive count before the result is returned, so that
`result / count` is each part's mean over the contributions its owner
accepted, with the same bits on every member.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import trio

from ...protocol.codec import encode
from ...protocol.gradguard import Contribution, GradGuard
from ...protocol.messages import AllReduceChunk, TensorHeader
from ..net.bootstrap import backoff_s
from ..net.host import Host, PeerUnreachable
from .chunkcheck import checked_chunk, sq_norm

log = logging.getLogger("gwtf.transport")

# A chunk whose send fails (`PeerUnreachable`: a connection broken or refusing streams on a loaded machine) is
# sent again after SEND_RETRY_FIRST_S, then twice as long each time up to SEND_RETRY_MAX_S, within the round's
# timeout: a round given up on one lost frame would leave its members stepping apart.
SEND_RETRY_FIRST_S = 0.5
SEND_RETRY_MAX_S = 8.0
MAX_PENDING_KEYS = 64  # rounds buffered before all_reduce is called for them
# a received payload under this is copied and checked in the event loop: handing it to a thread and back costs more
# than the check (a tiny model's parts: in a 50-daemon swarm on 2 cores, 7 % of a relay's busy samples went to
# starting those hand-offs)
INLINE_CHECK_BYTES = 64 * 1024
HOLD_CHECK_S = 1.0  # how often a round's deadline is moved to `timeout` after the last payload byte (module doc)
_DONE_KEYS_KEPT = 256  # finished rounds remembered, to drop their late chunks quietly
RESEND_FIRST_S = 30.0  # a member missing an owner's sum this long (or 2x the last round) resends its part ...
RESEND_MAX_S = 60.0  # ... doubling up to this
ANSWER_AGAIN_TIMEOUT_S = 10.0  # one attempt to send a summed part again (the member asks again if it is lost)
REDUCE, GATHER = 1, 2  # AllReduceChunk.phase
WIRE_DTYPES = {"float32": (torch.float32, 4), "bfloat16": (torch.bfloat16, 2)}  # name -> (dtype, bytes per element)
RUN_WIRE = {"fp32": "float32", "bf16": "bfloat16"}  # a run's `train.wire_dtype` -> the all-reduce's wire dtype


class AllReduceError(RuntimeError):
    """An all-reduce round failed (a peer unreachable, a bad group)."""


class AllReduceTimeout(AllReduceError):
    """Some peers did not deliver their parts in time; `missing` lists them."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


def part_bounds(length: int, n: int, i: int) -> tuple[int, int]:
    return i * length // n, (i + 1) * length // n


@dataclass
class _Round:
    # (phase, part, sender) -> (count, tensor); early chunks are not yet length-checked
    chunks: dict[tuple[int, int, str], tuple[float, torch.Tensor]] = field(default_factory=dict)
    group: list[str] | None = None
    length: int = 0
    wire: str = "float32"  # the dtype of the chunks on the wire (WIRE_DTYPES)
    dtypes: dict[tuple[int, int, str], str] = field(default_factory=dict)  # the dtype each chunk came in
    norms: dict[tuple[int, int, str], float] = field(default_factory=dict)  # squared norm of each chunk (checked)
    sending: int = 0  # this round's first sends of a part still under way (not those sent again)
    sent_at: float = -math.inf  # ... and when the last of them ended (trio time)
    changed: trio.Event = field(default_factory=trio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def missing(self, phase: int, mine: int) -> list[str]:
        """The peers whose chunks of `phase` this peer (owner of part `mine`) still waits for."""
        group = self.group
        if phase == REDUCE:
            return [p for p in group if (REDUCE, mine, p) not in self.chunks]
        return [group[i] for i in range(len(group)) if i != mine and (GATHER, i, group[i]) not in self.chunks]


class AllReducer:
    """All-reduce rounds over a `Host`; hand it the AllReduceChunk frames with `on_chunk`."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._rounds: OrderedDict[str, _Round] = OrderedDict()
        self._done: OrderedDict[str, None] = OrderedDict()
        self.guard = GradGuard()  # judges the contributions to the parts this node owns
        self.outliers_refused = 0  # contributions left out of a part's sum (status.json)
        self.send_retries = 0  # chunks sent again after a failed send (module doc)
        self.resend_after_s = RESEND_FIRST_S
        self.resends = 0  # phase-1 parts sent again because their owner's sum did not come (module doc)
        self.answered_again = 0  # summed parts sent again to a member that asked by sending its part again
        self._sums: dict[str, tuple] = {}  # key -> (group, part, count, sum, wire) of the last round (module doc)
        self.limiter = trio.CapacityLimiter(1)  # the whole-part tensor work, off the event loop (module doc)
        self._work_s: dict[str, float] = {}  # round key -> seconds of tensor work in the worker thread so far
        self.last_round: dict | None = None  # the last round that summed: key, seconds, tensor work, MB sent
        self._last_chunk: dict[str, tuple[str, float]] = {}  # peer -> (key, trio time) of its last chunk here

    async def _in_thread(self, key: str, fn, *args):
        """`fn(*args)` in the worker thread; its time counts as tensor work of round `key`."""
        def timed():
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self._work_s[key] = self._work_s.get(key, 0.0) + time.perf_counter() - t0

        return await trio.to_thread.run_sync(timed, limiter=self.limiter)

    @staticmethod
    def accepts(msg: object) -> bool:
        return isinstance(msg, AllReduceChunk)

    # ---- incoming ---------------------------------------------------------------

    def _refuse(self, peer_id: str, msg: AllReduceChunk, why: str) -> None:
        log.warning("all-reduce chunk refused: key %r part %d phase %d from %s: %s",
                    msg.key, msg.part, msg.phase, peer_id, why)

    def _check_fits(self, rnd: _Round, phase: int, part: int, sender: str, t: torch.Tensor) -> str | None:
        """Why a chunk does not fit a started round (None if it does)."""
        group = rnd.group
        assert group is not None
        n = len(group)
        me = self.host.peer_id
        if sender not in group:
            return f"sender is not in the group {group}"
        if not 0 <= part < n:
            return f"part {part} out of range for a group of {n}"
        if phase == REDUCE and group[part] != me:
            return f"phase-1 part {part} belongs to {group[part]}, not to this peer"
        if phase == GATHER and group[part] != sender:
            return f"phase-2 part {part} must come from its owner {group[part]}"
        lo, hi = part_bounds(rnd.length, n, part)
        if t.numel() != hi - lo:
            return f"part has {t.numel()} floats, expected {hi - lo}"
        if sender != me and rnd.dtypes.get((phase, part, sender), rnd.wire) != rnd.wire:
            return f"dtype {rnd.dtypes[(phase, part, sender)]}, the round's is {rnd.wire}"
        return None

    async def on_chunk(self, peer_id: str, msg: AllReduceChunk, payload: bytes | bytearray | memoryview) -> None:
        self._last_chunk[peer_id] = (msg.key, trio.current_time())
        if msg.key in self._done:
            log.debug("late all-reduce chunk for finished round %r from %s dropped", msg.key, peer_id)
            if msg.phase == REDUCE:
                await self._answer_again(msg.key, peer_id)
            return
        h = msg.tensor
        if h is None:
            return self._refuse(peer_id, msg, "no tensor header")
        if h.dtype not in WIRE_DTYPES:
            return self._refuse(peer_id, msg, f"dtype {h.dtype!r}, expected one of {', '.join(WIRE_DTYPES)}")
        size = WIRE_DTYPES[h.dtype][1]
        if h.nbytes != len(payload) or h.nbytes % size or tuple(h.shape) != (h.nbytes // size,):
            return self._refuse(peer_id, msg, f"header {h} does not describe the {len(payload)} payload bytes")
        if msg.phase not in (REDUCE, GATHER):
            return self._refuse(peer_id, msg, f"unknown phase {msg.phase}")
        if not math.isfinite(msg.count):
            return self._refuse(peer_id, msg, f"count {msg.count} is not finite")
        wire = WIRE_DTYPES[h.dtype][0]
        checked = (checked_chunk(payload, wire) if len(payload) < INLINE_CHECK_BYTES
                   else await self._in_thread(msg.key, checked_chunk, payload, wire))
        if checked is None:
            return self._refuse(peer_id, msg, "tensor holds NaN or infinity")
        t, sq = checked
        if msg.key in self._done:  # (finished while the payload was checked)
            return
        rnd = self._rounds.get(msg.key)
        if rnd is None:
            if len(self._rounds) >= MAX_PENDING_KEYS:
                return self._refuse(peer_id, msg, f"{MAX_PENDING_KEYS} rounds already pending")
            rnd = self._rounds[msg.key] = _Round()
        slot = (msg.phase, msg.part, peer_id)
        if slot in rnd.chunks:  # sent again (module doc): a phase-1 copy asks for this owner's sum again
            log.debug("all-reduce %r: part %d (phase %d) from %s again", msg.key, msg.part, msg.phase, peer_id)
            if msg.phase == REDUCE:
                await self._answer_again(msg.key, peer_id)
            return
        rnd.dtypes[slot] = h.dtype
        if rnd.group is not None and (why := self._check_fits(rnd, msg.phase, msg.part, peer_id, t)):
            del rnd.dtypes[slot]
            return self._refuse(peer_id, msg, why)
        rnd.chunks[slot] = (msg.count, t)
        rnd.norms[slot] = sq
        rnd.notify()

    async def _answer_again(self, key: str, peer: str) -> None:
        """`peer` sent its part of `key` again: it lacks this owner's sum; one attempt to send it again."""
        kept = self._sums.get(key)
        if kept is None or peer not in kept[0] or peer == self.host.peer_id:
            return
        group, part, count, acc, wire = kept
        self.answered_again += 1
        log.info("all-reduce %r: %s asks again for part %d: sent again", key, peer, part)
        with trio.move_on_after(ANSWER_AGAIN_TIMEOUT_S):
            try:
                await self._send_once(peer, key, part, GATHER, count, acc, wire)
            except PeerUnreachable as e:
                log.info("all-reduce %r: part %d not sent again to %s (%s): it asks again", key, part, peer, e)

    async def _resend_missing(self, key: str, rnd: _Round, mine: int, flat: torch.Tensor, count: float,
                              nursery: trio.Nursery) -> None:
        """Send an owner whose sum has not come its part again, after `resend_after_s`, doubling.

        A chunk can be lost after its send returned (its connection reset under it on a loaded machine:
        py-libp2p drops what it had buffered), and one lost chunk would hold the whole round to its timeout.
        So a member still missing an owner's summed part `resend_after_s` (30 s, or twice the last round's
        duration; doubling to 60 s) after the round began sends that owner its phase-1 part again; an owner
        that already has it takes the copy as the question it is and sends its summed part again
        (`_answer_again`), also after the round ended for it: its summed part of the last round (4 P / n
        bytes for P parameters among n members) is kept until it starts the next round.  Duplicates are
        otherwise dropped quietly (`resends`, `answered_again`)."""
        n = len(rnd.group)
        first = self._resend_wait()
        for attempt in itertools.count(1):
            with trio.move_on_after(backoff_s(attempt, first, max(first, RESEND_MAX_S))):
                while rnd.missing(GATHER, mine):
                    await rnd.changed.wait()
                return
            for owner in rnd.missing(GATHER, mine):
                if trio.current_time() - self._moved_at([owner]) < first:  # bytes move with it: slow, not lost
                    continue
                i = rnd.group.index(owner)
                self.resends += 1
                log.info("all-reduce %r: no sum of part %d from %s yet: its part sent again", key, i, owner)
                nursery.start_soon(self._send_part, owner, key, i, REDUCE, count,
                                   flat[slice(*part_bounds(rnd.length, n, i))], rnd.wire)

    # ---- one round ----------------------------------------------------------------

    async def _chunk(self, key: str, part: int, phase: int, count: float, t: torch.Tensor, wire: str):
        """The envelope and payload of `t` as a chunk in the `wire` dtype (a bfloat16 round's parts are converted in
        the worker thread)."""
        dtype, size = WIRE_DTYPES[wire]
        if t.dtype != dtype:
            t = await self._in_thread(key, t.to, dtype)
        t = t.contiguous()
        as_bytes = t.view(torch.int16) if dtype == torch.bfloat16 else t  # (numpy has no bfloat16)
        data = memoryview(as_bytes.numpy()).cast("B") if t.numel() else b""
        header = TensorHeader(dtype=wire, shape=(t.numel(),), nbytes=t.numel() * size)
        env = encode(self.host.peer_id, AllReduceChunk(key=key, part=part, phase=phase, count=count, tensor=header))
        return env, data

    async def _send_once(self, peer: str, key: str, part: int, phase: int, count: float, t: torch.Tensor,
                         wire: str) -> None:
        env, data = await self._chunk(key, part, phase, count, t, wire)
        await self.host.send(peer, env, data)

    async def _send_part(self, peer: str, key: str, part: int, phase: int, count: float, t: torch.Tensor,
                         wire: str = "float32") -> None:
        """`t` to `peer` in the `wire` dtype, sent again until it leaves (module doc)."""
        env, data = await self._chunk(key, part, phase, count, t, wire)
        for attempt in itertools.count(1):
            try:
                return await self.host.send(peer, env, data)
            except PeerUnreachable as e:
                self.send_retries += 1
                delay = backoff_s(attempt, SEND_RETRY_FIRST_S, SEND_RETRY_MAX_S)
                log.warning("all-reduce %r: part %d (phase %d) to %s not sent (%s): sent again in %.1f s", key, part,
                            phase, peer, e, delay)
            await trio.sleep(delay)

    async def _send_first(self, rnd: _Round, *args) -> None:
        """`_send_part(*args)`, counted in `rnd.sending` while under way (the round's deadline follows its bytes)."""
        rnd.sending += 1
        try:
            await self._send_part(*args)
        finally:
            rnd.sending -= 1
            rnd.sent_at = trio.current_time()

    def _moved_at(self, peers: list[str], went: bool = True, came: bool = True) -> float:
        """When a payload record last came from one of `peers` (`came`), or went to one (`went`) (trio time; -inf:
        never)."""
        moved = self.host.payload_moved
        return max((moved.get((p, c), -math.inf) for p in peers for c in (True, False) if (came if c else went)),
                   default=-math.inf)

    def _resend_wait(self) -> float:
        return max(self.resend_after_s, 2 * (self.last_round or {}).get("seconds", 0.0))

    def _elsewhere(self, peer: str, key: str, since: float) -> bool:
        """`peer`'s last chunk here is for another round of `key`'s stage and iteration (the keys differ in their
        group digest only, regroup.py), and came `since` or later: it runs that round (module doc)."""
        last = self._last_chunk.get(peer)
        return (last is not None and last[0] != key and last[1] >= since
                and last[0].rpartition("/")[0] == key.rpartition("/")[0])

    async def all_reduce(
        self, key: str, group: list[str], tensor: torch.Tensor, count: float, timeout: float,
        max_count: float | None = None, wire: str = "float32",
    ) -> tuple[torch.Tensor, float]:
        """(sum of the group's tensors, sum of their counts); identical bits on every peer.

        Contributions an owner refuses (`max_count`: the most microbatches one may claim) are left out of
        their part; see the module docstring for how the result is scaled then.  `wire`: the dtype of the
        chunks (WIRE_DTYPES; module doc)."""
        group = self._check_call(key, group, tensor)
        self._sums = {}  # (the last round's sum: its members have moved on)
        if wire not in WIRE_DTYPES:
            raise AllReduceError(f"all-reduce {key!r}: wire dtype {wire!r}, expected one of {', '.join(WIRE_DTYPES)}")
        started = time.perf_counter()
        flat = tensor.detach().contiguous()
        if wire != "float32":  # every contribution rounded once, this peer's too (module doc)
            flat = await self._in_thread(key, flat.to, WIRE_DTYPES[wire][0])
        rnd, mine = self._start_round(key, group, flat, count, wire)
        result = torch.empty(flat.numel(), dtype=torch.float32)
        my_count = await self._exchange(key, rnd, mine, flat, float(count), max_count, result, timeout)
        out = await self._assemble(key, rnd, mine, my_count, result)
        self._record(key, started, len(group), flat.numel() * WIRE_DTYPES[wire][1])
        return out

    def _check_call(self, key: str, group: list[str], tensor: torch.Tensor) -> list[str]:
        """The group, sorted by peer id, once this peer, the tensor and the key are fit for a round."""
        me = self.host.peer_id
        group = sorted(set(group))
        if me not in group:
            raise AllReduceError(f"all-reduce {key!r}: this peer {me} is not in the group {group}")
        if tensor.dim() != 1 or tensor.dtype != torch.float32:
            raise AllReduceError(f"all-reduce {key!r}: needs a 1-D float32 tensor, got {tensor.dtype} {tuple(tensor.shape)}")
        if key in self._done:
            raise AllReduceError(f"all-reduce {key!r} already ran on this peer: use a fresh key per round")
        return group

    def _start_round(self, key: str, group: list[str], flat: torch.Tensor, count: float,
                     wire: str = "float32") -> tuple[_Round, int]:
        """The round of `key` (with the chunks that came early and fit it) holding this peer's contribution to its
        own part; and the index of that part."""
        me = self.host.peer_id
        n, length = len(group), flat.numel()
        mine = group.index(me)
        rnd = self._rounds.get(key)
        if rnd is None:
            rnd = self._rounds[key] = _Round()
        rnd.group, rnd.length, rnd.wire = group, length, wire
        for (phase, part, sender), (_c, t) in list(rnd.chunks.items()):  # chunks that came early
            if why := self._check_fits(rnd, phase, part, sender, t):
                log.warning("all-reduce chunk refused: key %r part %d phase %d from %s: %s", key, part, phase, sender, why)
                del rnd.chunks[(phase, part, sender)]
        rnd.chunks[(REDUCE, mine, me)] = (float(count), flat[slice(*part_bounds(length, n, mine))])
        return rnd, mine

    async def _exchange(self, key: str, rnd: _Round, mine: int, flat: torch.Tensor, count: float,
                        max_count: float | None, result: torch.Tensor, timeout: float) -> float:
        """Both phases, within `timeout`: send every other owner its part of `flat`, sum this peer's part into
        `result` and send it on, wait for the others' summed parts; the count of this peer's part.  The round is
        forgotten at the end (its late chunks dropped, its key not run again), unless it was cancelled: then
        what came for it is kept, as chunks that come early are, for the same key run again (regroup.py redoes
        a round cancelled for a member presumed dead with it once it is back: the same group, the same
        contributions, so every chunk that came is still right)."""
        me, group, n = self.host.peer_id, rnd.group, len(rnd.group)
        total = [0.0]
        deadline = trio.CancelScope(deadline=trio.current_time() + timeout)

        async def reduce_mine(nursery: trio.Nursery) -> None:
            total[0] = await self._reduce_and_send(key, rnd, mine, max_count, result, nursery)

        # a member's chunks of another round that come once this one has waited its resend wait are that round's
        settled = trio.current_time() + self._resend_wait()
        others = [p for p in group if p != me]

        async def hold() -> None:  # the deadline: `timeout` after payload bytes last moved with a member (module doc)
            while True:
                await trio.sleep(HOLD_CHECK_S)
                here = [p for p in others if not self._elsewhere(p, key, settled)]
                moved = max(self._moved_at(others, went=rnd.sending > 0, came=False), self._moved_at(here, went=False),
                            rnd.sent_at)
                deadline.deadline = max(deadline.deadline, moved + timeout)

        try:
            with deadline:
                async with trio.open_nursery() as holding:
                    holding.start_soon(hold)
                    async with trio.open_nursery() as nursery:  # (ends when this peer's sum and sends are done too)
                        for i, owner in enumerate(group):
                            if owner != me:
                                nursery.start_soon(self._send_first, rnd, owner, key, i, REDUCE, count,
                                                   flat[slice(*part_bounds(rnd.length, n, i))], rnd.wire)
                        nursery.start_soon(reduce_mine, nursery)
                        nursery.start_soon(self._resend_missing, key, rnd, mine, flat, count, nursery)
                        while rnd.missing(GATHER, mine):
                            await rnd.changed.wait()
                    holding.cancel_scope.cancel()
            if deadline.cancelled_caught:
                raise trio.TooSlowError
        except trio.TooSlowError:
            self._forget(key)
            late_reduce, late_gather = rnd.missing(REDUCE, mine), rnd.missing(GATHER, mine)
            who = sorted(set(late_reduce) | set(late_gather))
            raise AllReduceTimeout(
                f"all-reduce {key!r} timed out after {timeout} s without payload bytes from or to its "
                f"{n - 1} other peers: "
                f"no phase-1 part from {late_reduce or 'nobody'}, "
                f"no phase-2 (summed) part from {late_gather or 'nobody'}",
                who,
            ) from None
        except BaseException as e:
            if all(isinstance(x, trio.Cancelled) for x in _leaves(e)):
                self._rounds.move_to_end(key)  # (kept, as a pending round: `all_reduce` may run this key again)
            else:
                self._forget(key)
            raise
        self._forget(key)
        return total[0]

    async def _reduce_and_send(self, key: str, rnd: _Round, mine: int, max_count: float | None,
                               result: torch.Tensor, nursery: trio.Nursery) -> float:
        """The owner's work (steps 3 and 4 of the module docstring): once every contribution to its part is in, sum
        those the guard accepts, in sorted-peer-id order, into `result`, and send the sum to every other peer;
        the part's count."""
        me, group, length = self.host.peer_id, rnd.group, rnd.length
        while rnd.missing(REDUCE, mine):
            await rnd.changed.wait()
        lo, hi = part_bounds(length, len(group), mine)
        mine_in = [rnd.chunks[(REDUCE, mine, p)] for p in group]
        if (REDUCE, mine, me) not in rnd.norms:  # (a received chunk's norm comes with its check)
            rnd.norms[(REDUCE, mine, me)] = await self._in_thread(key, sq_norm, rnd.chunks[(REDUCE, mine, me)][1])
        norms = [rnd.norms[(REDUCE, mine, p)] for p in group]
        contribs = [Contribution(p, c, sq, hi - lo) for p, (c, _t), sq in zip(group, mine_in, norms)]
        verdict = self.guard.judge((lo, hi, length), contribs, max_count)
        for p, why in sorted(verdict.refused.items()):
            self.outliers_refused += 1
            log.warning("all-reduce %r: contribution of %s to part %d refused: %s", key, p, mine, why)
        accepted = [rnd.chunks[(REDUCE, mine, p)] for p in verdict.accepted(group)]
        acc, cnt = await self._in_thread(key, _sum_in_order, accepted, hi - lo, result, (lo, hi),
                                         WIRE_DTYPES[rnd.wire][0])
        self._sums = {key: (list(group), mine, cnt, acc, rnd.wire)}  # (for a member that asks again)
        for p in group:
            if p != me:
                nursery.start_soon(self._send_first, rnd, p, key, mine, GATHER, cnt, acc, rnd.wire)
        return cnt

    def _forget(self, key: str) -> None:
        """The round of `key` is over: its late chunks are dropped from now on."""
        self._rounds.pop(key, None)
        self._done[key] = None
        if len(self._work_s) > MAX_PENDING_KEYS:  # (rounds that failed, and late chunks' keys)
            self._work_s.clear()
        while len(self._done) > _DONE_KEYS_KEPT:
            self._done.popitem(last=False)

    async def _assemble(self, key: str, rnd: _Round, mine: int, my_count: float,
                        result: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The others' summed parts copied into `result` beside this peer's, scaled to their common count."""
        group, length, n = rnd.group, rnd.length, len(rnd.group)
        counts = [my_count if i == mine else rnd.chunks[(GATHER, i, group[i])][0] for i in range(n)]

        def assemble() -> tuple[torch.Tensor, float]:
            for i in range(n):
                if i != mine:
                    result[slice(*part_bounds(length, n, i))] = rnd.chunks[(GATHER, i, group[i])][1]
            return _common_count(result, counts, length, key)

        return await self._in_thread(key, assemble)

    def _record(self, key: str, started: float, n: int, nbytes: int) -> None:
        """`last_round`, and the debug line, of the round of `key` that just summed (`nbytes`: the vector's on the
        wire)."""
        work = self._work_s.pop(key, 0.0)
        self.last_round = {"key": key, "seconds": round(time.perf_counter() - started, 4),
                           "tensor_work_s": round(work, 4), "sent_mb": round(2 * (n - 1) / n * nbytes / 1e6, 3)}
        log.debug("all-reduce %r among %d: %.2f s, of which %.2f s tensor work (checks, norms, sums) in the worker "
                 "thread; %.1f MB sent", key, n, self.last_round["seconds"], work, self.last_round["sent_mb"])


def _sum_in_order(chunks: list[tuple[float, torch.Tensor]], length: int, result: torch.Tensor,
                  bounds: tuple[int, int], wire: torch.dtype = torch.float32) -> tuple[torch.Tensor, float]:
    """The sum of the accepted contributions to this node's part (in the `wire` dtype), in sorted-peer order
    (the same float32 additions on every run), rounded to the `wire` dtype as it is sent and written into its place
    in `result`; that rounded sum (in the `wire` dtype, as sent) and the count.  In a worker thread."""
    acc, cnt = torch.zeros(length, dtype=torch.float32), 0.0
    for i, (c, t) in enumerate(chunks):
        acc = t.to(torch.float32, copy=True) if i == 0 else acc.add_(t)
        cnt = c if i == 0 else cnt + c
    if wire != torch.float32:
        acc = acc.to(wire)
    result[slice(*bounds)] = acc
    return acc, cnt


def _common_count(result: torch.Tensor, counts: list[float], length: int, key: str) -> tuple[torch.Tensor, float]:
    """(result, count) with one count for every part: the smallest positive part count, each part scaled to it
    (a part whose owner refused contributions holds fewer); a part with count 0 holds no gradient."""
    if len(set(counts)) == 1:
        return result, counts[0]
    positive = [c for c in counts if c > 0]
    if not positive:
        return result.zero_(), 0.0
    common = min(positive)
    log.warning("all-reduce %r: parts summed over different counts %s (contributions refused): each part "
                "scaled to %g", key, counts, common)
    n = len(counts)
    for i, c in enumerate(counts):
        part = result[slice(*part_bounds(length, n, i))]
        if c <= 0:
            part.zero_()
        elif c != common:
            part.mul_(common / c)
    return result, common


def _leaves(e: BaseException):
    if isinstance(e, BaseExceptionGroup):
        for x in e.exceptions:
            yield from _leaves(x)
    else:
        yield e


def all_reduce_failure(e: BaseException, kind: type) -> bool:
    """True if `e` (maybe an exception group from a nursery) holds nothing but all-reduce failures."""
    return all(isinstance(x, kind) for x in _leaves(e))


def leaf(e: BaseException) -> BaseException:
    """The first failure in `e` (maybe an exception group from a nursery)."""
    return next(iter(_leaves(e)), e)
