"""Deterministic discrete-event simulator for protocol machines.

The simulator owns its event queue: a heap of `(time, seq, ...)` where `seq`
is a global counter, so ties break in insertion order and a run is a pure
function of the scenario, the machines' seeds and the fault plan.  Messages
between two nodes take the link's one-way delay and are delivered in order
(same delay, increasing seq: FIFO per directed link, as on a libp2p stream).
Timers follow `SetTimer`/`CancelTimer` effects; setting a key again replaces
the earlier deadline (stale heap entries are skipped by a version check).

Nodes without a listed link (same-stage peers in the flow tests of Table V,
which list training links only) still exchange control messages over the
internet; they use `fallback_delay_s`.

`lose(sender, receiver, msg)`, where given, loses the messages it is true
for (counted in `SimStats.lost`): a link that drops a frame, as a libp2p
connection reset does; by default none is lost.

A driver with its own kinds of events (the training simulator, `sim/train/`:
tensor transfers on FIFO links, compute queues, crashes, joins) uses the same
queue and clock through `push` and `next_event` and interprets each event
itself; such a driver does not call `run_until` (its kinds are its own).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..protocol.effects import CancelTimer, Send, SetTimer


class Machine(Protocol):
    def start(self, now: float) -> list: ...
    def on_message(self, now: float, sender: str, msg: Any) -> list: ...
    def on_timer(self, now: float, key: str) -> list: ...


_MSG, _TIMER, _MANY = 0, 1, 2  # _MANY: one message object to several receivers at the same time (see _apply)


@dataclass
class SimStats:
    messages: int = 0
    messages_by_type: dict[str, int] = field(default_factory=dict)
    events: int = 0
    lost: int = 0  # messages `lose` dropped


class Simulator:
    def __init__(self, delay_s: Callable[[str, str], float | None], fallback_delay_s: float = 0.01,
                 lose: Callable[[str, str, Any], bool] | None = None) -> None:
        self.delay_s = delay_s
        self.lose = lose
        self.fallback_delay_s = fallback_delay_s
        self.machines: dict[str, Machine] = {}
        self.dead: set[str] = set()
        self.now = 0.0
        self._heap: list[tuple] = []
        self._seq = 0
        self._timer_version: dict[tuple[str, str], int] = {}
        self._delay_cache: dict[tuple[str, str], float] = {}
        self._delays_from: dict[str, dict[str, float]] = {}  # sender -> receiver -> delay (the hot path's copy)
        self.stats = SimStats()

    def add(self, node_id: str, machine: Machine) -> None:
        self.machines[node_id] = machine

    def start_all(self) -> None:
        for nid in sorted(self.machines):
            self._apply(nid, self.machines[nid].start(self.now))

    def _push(self, t: float, kind: int, node: str, a: Any, b: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, node, a, b))

    def push(self, t: float, kind: int, node: str, a: Any = None, b: Any = None) -> None:
        """Queue a driver's own event at time `t`; events of equal time come out in the order they were pushed."""
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, node, a, b))

    def next_event(self, t_limit: float) -> tuple[float, int, str, Any, Any] | None:
        """The next event `(t, kind, node, a, b)` in (time, push order), with the clock moved to `t`; None when
        the queue is empty or the next event is after `t_limit` (then the clock stays)."""
        if not self._heap:
            return None
        t, _, kind, node, a, b = heapq.heappop(self._heap)
        if t > t_limit:
            return None
        self.now = t
        return t, kind, node, a, b

    def _link_delay(self, a: str, b: str) -> float:
        key = (a, b)
        d = self._delay_cache.get(key)
        if d is None:
            d = self.delay_s(a, b)
            if d is None:
                d = self.fallback_delay_s
            self._delay_cache[key] = d
        return d

    def _apply(self, nid: str, effects: list) -> None:
        if not effects:
            return
        now = self.now
        heap = self._heap
        stats = self.stats
        by_type = stats.messages_by_type
        delays = self._delays_from.get(nid)
        if delays is None:
            delays = self._delays_from[nid] = {}
        push = heapq.heappush
        last_msg = name = None
        sent = 0  # Sends of `last_msg` not counted yet (a message told to many peers is one object)
        seq = self._seq
        # consecutive Sends of one message object with the same delay arrive at the same time, in the order of
        # their (consecutive) sequence numbers, with nothing in between: one heap entry (_MANY) delivers them
        # all (run_until), with the first one's sequence number
        groups: dict[float, tuple[int, list[str]]] = {}
        for e in effects:
            te = type(e)
            if te is Send:
                msg = e.msg
                if msg is not last_msg:
                    if sent:
                        stats.messages += sent
                        by_type[name] = by_type.get(name, 0) + sent
                        sent = 0
                    if groups:
                        self._push_groups(groups, now, nid, last_msg)
                    last_msg, name = msg, type(msg).__name__
                sent += 1
                to = e.to
                d = delays.get(to)
                if d is None:
                    d = delays[to] = self._link_delay(nid, to)
                seq += 1
                g = groups.get(d)
                if g is None:
                    groups[d] = (seq, [to])
                else:
                    g[1].append(to)
                continue
            if groups:
                self._push_groups(groups, now, nid, last_msg)
            last_msg = None
            if te is SetTimer:
                k = (nid, e.key)
                v = self._timer_version.get(k, 0) + 1
                self._timer_version[k] = v
                seq += 1
                push(heap, (max(e.deadline, now), seq, _TIMER, nid, e.key, v))
            elif te is CancelTimer:
                k = (nid, e.key)
                self._timer_version[k] = self._timer_version.get(k, 0) + 1
            else:
                raise TypeError(f"unknown effect {e!r} from {nid}")
        if groups:
            self._push_groups(groups, now, nid, last_msg)
        self._seq = seq
        if sent:
            stats.messages += sent
            by_type[name] = by_type.get(name, 0) + sent

    def _push_groups(self, groups: dict, now: float, nid: str, msg: Any) -> None:
        heap = self._heap
        for d, (seq, tos) in groups.items():
            if len(tos) == 1:
                heapq.heappush(heap, (now + d, seq, _MSG, tos[0], nid, msg))
            else:
                heapq.heappush(heap, (now + d, seq, _MANY, tuple(tos), nid, msg))
        groups.clear()

    def run_until(self, t_end: float, stop: Callable[[float], bool] | None = None,
                  check_every_s: float = 1.0) -> None:
        """Process events up to `t_end`; `stop(now)` is asked every `check_every_s`."""
        next_check = self.now + check_every_s
        heap = self._heap
        pop = heapq.heappop
        dead = self.dead
        machines = self.machines
        stats = self.stats
        apply = self._apply
        lose = self.lose
        while heap and heap[0][0] <= t_end:
            t, _, kind, node, a, b = pop(heap)
            if stop is not None and t >= next_check:
                self.now = next_check
                if stop(next_check):
                    heapq.heappush(heap, (t, _, kind, node, a, b))
                    return
                next_check += check_every_s
            self.now = t
            if kind == _MANY:  # `node` is the receivers: handled as the separate events they stand for
                for i, to in enumerate(node):
                    if i and stop is not None and t >= next_check:
                        self.now = next_check
                        if stop(next_check):
                            heapq.heappush(heap, (t, _, _MANY, node[i:], a, b))
                            return
                        next_check += check_every_s
                        self.now = t
                    if to in dead:
                        continue
                    if lose is not None and lose(a, to, b):
                        stats.lost += 1
                        continue
                    stats.events += 1
                    effects = machines[to].on_message(t, a, b)
                    if effects:
                        apply(to, effects)
                continue
            if node in dead:
                continue
            if kind == _MSG and lose is not None and lose(a, node, b):
                stats.lost += 1
                continue
            m = machines[node]
            stats.events += 1
            if kind == _MSG:
                effects = m.on_message(t, a, b)
                if effects:
                    apply(node, effects)
            else:
                if self._timer_version.get((node, a)) != b:
                    continue
                apply(node, m.on_timer(t, a))
        self.now = max(self.now, t_end) if not heap or heap[0][0] > t_end else self.now

    def kill(self, node_id: str) -> None:
        """Crash a node: it stops handling events; messages to it are dropped."""
        self.dead.add(node_id)
