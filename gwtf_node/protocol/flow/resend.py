"""Each message of scaled formation taken once, and a lost one sent again.

Cost scaling moves units and credit in its messages (flow/scaling.py): a lost
frame loses both (its phase never ends, and the flows on its link disagree),
and one taken twice counts them twice.  Links deliver a peer's frames in order
(the daemon's outbox, the simulator's FIFO links) but may lose one (a libp2p
connection reset).  `Resender` numbers the messages a node sends each peer
(`seq`, from 1), keeps them, and takes each number once; each carries how far
the sender took the receiver's (`ack`), so that only a message not known to
have come is sent again on a probe:

* a gap (7 after 5) means 6 was lost: the receiver asks for it
  (`ScaleNack`), again after `RENACK_S` while it is missing;
* the last message to a peer leaves no gap behind it, so the data node,
  hearing nothing new of formation for `DATA_PROBE_S` (or `QUIET_FACTOR` x
  the longest silence formation's own pace gave it), probes every node
  (`ScaleProbe`, carrying how many it sent the receiver: the receiver asks
  for what it lacks), the interval doubling while nothing new comes, at most
  `PROBE_DOUBLINGS` times (losses during the work a probe restarts need the
  next one soon).  A node probed sends its last message again to every peer
  that has not acknowledged it: a lost one arrives, one that came is a
  duplicate, dropped, counted and acknowledged (a `ScaleNack` asking for
  nothing, with `ack`: where traffic is one-way no later message carries
  it, and every probe would send the last one again: over every link at
  1000 x 16, 1.73 M duplicates).  Once formation is over the data node
  probes the nodes that have not acknowledged its end until they do (each
  answers `ScaleDone` and `ScaleAbort` with an empty `ScaleCredit`).

Unnumbered: `ScalePrice` (it moves no credit), `ScaleNack` and `ScaleProbe`
(a lost one is asked again).  A node answers these after its formation is
over too (its peers may still lack its last messages).  Pure: the caller hands
in `now`.
"""

from __future__ import annotations

from dataclasses import replace

from ..effects import Effect, Send
from ..scalemsgs import NUMBERED, ScaleNack, ScaleProbe

RENACK_S = 5.0  # a message asked for and still missing is asked for again after this long
DATA_PROBE_S = 10.0  # the data node probes every peer after hearing nothing new of formation this long
QUIET_FACTOR = 4  # ... or after this many times the longest silence that ended without a probe, if longer
PROBE_DOUBLINGS = 2  # the interval between probes doubles while nothing new comes, at most this many times
MAX_NACK = 256  # numbers one ScaleNack asks for (more: the next one)
MAX_AHEAD = 1 << 16  # a number this far beyond the last one taken in order is refused (no gap that long is real)


class Resender:
    """The numbered messages a node sent each peer and the numbers it took from each (module doc)."""

    def __init__(self) -> None:
        self.sent: dict[str, list] = {}  # peer -> the numbered messages sent it, `seq` i at index i - 1
        self.upto: dict[str, int] = {}  # peer -> every number up to this one taken
        self.ahead: dict[str, set[int]] = {}  # peer -> numbers taken beyond `upto`
        self.acked: dict[str, int] = {}  # peer -> it took every message sent it up to this number
        self.asked: dict[tuple[str, int], float] = {}  # (peer, missing number) -> when it was last asked for
        self.duplicates = self.resent = self.refused = 0

    def number(self, effects: list[Effect]) -> list[Effect]:
        """`effects` with each message of a `NUMBERED` type not numbered yet stamped with its peer's next number (and
        how far this node took the peer's) and kept (one sent again keeps its number)."""
        out = []
        for e in effects:
            if isinstance(e, Send) and isinstance(e.msg, NUMBERED) and not e.msg.seq:
                log = self.sent.setdefault(e.to, [])
                e = Send(e.to, replace(e.msg, seq=len(log) + 1, ack=self.upto.get(e.to, 0)))
                log.append(e.msg)
            out.append(e)
        return out

    def take(self, now: float, sender: str, seq: int, ack: int = 0) -> tuple[bool, list[Effect]]:
        """Whether the message numbered `seq` from `sender` is new (take it) or not (a duplicate, or too far
        ahead); and the `ScaleNack` for what is missing before it.  `ack`: the sender took this node's messages up
        to this number."""
        self._acked(sender, ack)
        upto, ahead = self.upto.get(sender, 0), self.ahead.setdefault(sender, set())
        if seq <= upto or seq in ahead or seq > upto + MAX_AHEAD:
            dup = seq <= upto or seq in ahead
            self.duplicates += dup
            self.refused += seq > upto + MAX_AHEAD
            return False, [Send(sender, ScaleNack((), ack=upto))] if dup else []  # (it came: no more probes send it)
        ahead.add(seq)
        while upto + 1 in ahead:
            upto += 1
            ahead.discard(upto)
            self.asked.pop((sender, upto), None)
        self.upto[sender] = upto
        return True, self._ask(now, sender, max(ahead, default=0))

    def probed(self, now: float, sender: str, probe: ScaleProbe, data: str, me: str) -> list[Effect]:
        """`sender` (the data node) probes (module doc): ask for what it sent and this node lacks, and send every
        peer the last message again where it is not acknowledged."""
        last = min(probe.last, self.upto.get(sender, 0) + MAX_AHEAD)
        eff = self._ask(now, sender, last + 1)
        peers = self.unacked(sorted(self.sent) if sender == data and me != data else [sender])
        return eff + self._again((p, [len(self.sent[p])]) for p in peers)

    def unacked(self, peers) -> list[str]:
        """Those of `peers` that have not acknowledged the last message sent them."""
        return [p for p in peers if len(self.sent.get(p, ())) > self.acked.get(p, 0)]

    def nacked(self, sender: str, nack: ScaleNack) -> list[Effect]:
        """`sender` lacks these: send them again; it took this node's messages up to `ack`."""
        self._acked(sender, nack.ack)
        return self._again([(sender, nack.seqs)])

    def _acked(self, peer: str, ack: int) -> None:
        """`peer` took this node's messages up to `ack` (at most what was sent it)."""
        self.acked[peer] = max(self.acked.get(peer, 0), min(ack, len(self.sent.get(peer, ()))))

    def probe(self, to: tuple[str, ...], phase: int) -> list[Effect]:
        return [Send(p, ScaleProbe(phase, len(self.sent.get(p, ())))) for p in to]

    def _again(self, wanted) -> list[Effect]:
        out: list[Effect] = []
        for peer, seqs in wanted:
            log = self.sent.get(peer, ())
            ack = self.upto.get(peer, 0)
            out += [Send(peer, replace(log[s - 1], ack=ack)) for s in dict.fromkeys(seqs) if 1 <= s <= len(log)]
        self.resent += len(out)
        return out

    def _ask(self, now: float, sender: str, below: int) -> list[Effect]:
        """A `ScaleNack` for the numbers from `sender` missing before `below`, not asked for in `RENACK_S`."""
        upto, ahead, missing = self.upto.get(sender, 0), self.ahead.get(sender, set()), []
        for s in range(upto + 1, below):
            if s not in ahead and now - self.asked.get((sender, s), -RENACK_S) >= RENACK_S:
                self.asked[(sender, s)] = now
                missing.append(s)
                if len(missing) == MAX_NACK:
                    break
        return [Send(sender, ScaleNack(tuple(missing)))] if missing else []
