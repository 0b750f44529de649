"""A state hand-over is checked against the stage's other members, not against its sender alone.

A newcomer (or a relay that fell behind) downloads its stage's weights and
optimizer state from one member (joining.py).  The SHA-256 the sender puts
in its `StageState` only proves the bytes arrived as sent: a hostile sender
can hash poisoned weights itself.  So before loading, the receiver computes
the parameter hash of the state it got (`params_hash`, the same hash as
`StageModel.state_hash`) and asks the stage's other ready members for theirs
at the same number of steps (a hash-only `StageStateRequest`); `verdict`
takes the state when the members that vouch for its hash (the sender
included) outnumber those that answer a different hash at the same step.

A member that answers at another step (it stepped meanwhile) or not at all
says nothing either way; with no comparable answer (a stage of one member)
the state is taken on the sender's word and the log says so: a quorum needs
other members.

A refused state names where to get the stage's state instead
(`next_source`): a member of the hash that more members hold than the
sender's (a strict majority of the answers at that step), one not tried
yet.  When no hash has such a majority (one honest member against one
hostile one: nothing tells them apart), there is no quorum: the joiner
loads nothing, says so in its log (and `Joining.handover`), and asks
again after a while (joining.py `NO_QUORUM_RETRY_S`): the stage's members
may have changed.  A majority of hostile members of one stage is out of scope
(docs/security.md).

Memory.  A stage's state is GBs on a large model (12 bytes a parameter with
AdamW), so each end holds its bytes once: the source sends the bytes of
`state_bytes()` themselves, in chunks (statechunks.py), the newcomer
assembles them in one buffer, checks it in place and reads it through a
file over it (`received_state`, `model/tensors.py` `BufferFile`).  The
source grows by the state's bytes while it sends; the newcomer's peak,
buffer included, stays within its part's estimate (model/memory.py;
tests/runtime/test_memory.py measures both).  The hashes run in the stage's
worker thread: a state of GBs takes seconds to hash, and the event loop
answers pings meanwhile.
"""

from __future__ import annotations

import hashlib


def params_hash(blob: bytes | bytearray | memoryview) -> str:
    """`StageModel.state_hash()` of the parameters inside a `state_bytes()` blob (without installing it)."""
    import torch

    from ...model.tensors import BufferFile

    try:
        state = torch.load(BufferFile(blob), map_location="cpu", weights_only=True)
        names, params = state["names"], state["params"]
    except Exception as e:  # noqa: BLE001 - torch raises several unrelated types for a corrupt archive
        from .checkpoints import load_error

        raise ValueError(f"stage state is not readable: {load_error(e)}") from None
    h = hashlib.sha256()
    for name, p in zip(names, params):
        h.update(name.encode() + b"\0")
        h.update(memoryview(p.detach().float().cpu().contiguous().numpy()).cast("B"))
    return h.hexdigest()


def received_state(msg, payload, max_bytes: int) -> memoryview:
    """The state blob a `StageState` carries, once its header and SHA-256 hold: a view of `payload`, not a copy;
    a ValueError says what is wrong.  In a worker thread (the hash)."""
    from ...model.tensors import TensorError, unpack

    try:
        blob = memoryview(unpack(msg.tensor, payload, expect_dtype="uint8", max_bytes=max_bytes).numpy())
    except TensorError as e:
        raise ValueError(f"StageState tensor refused: {e}") from None
    if hashlib.sha256(blob).hexdigest() != msg.sha256:
        raise ValueError("StageState hash mismatch: the state was corrupted or tampered with")
    return blob


def verdict(steps: int, digest: str, answers: dict[str, tuple[int, str]]) -> tuple[bool, str]:
    """(take the state?, why) for a state of `steps` steps with parameter hash `digest`, given the other
    members' hash-only answers `{peer: (their steps, their hash)}`; the sender vouches for its own state."""
    same = {p: h for p, (s, h) in answers.items() if s == steps}
    agree = 1 + sum(1 for h in same.values() if h == digest)
    disagree = len(same) - (agree - 1)
    if not same:
        return True, f"no other member answered at {steps} steps: taken on the sender's word"
    if agree > disagree:
        return True, f"{agree} of {len(same) + 1} members hold this state at {steps} steps"
    return False, (f"{disagree} of {len(same) + 1} members hold another state at {steps} steps than the sender's "
                   f"(parameter hash {digest[:12]}...): refused, the state was not the stage's")


def next_source(steps: int, digest: str, answers: dict[str, tuple[int, str]], tried: set[str]) -> str | None:
    """After the state of `steps` steps with hash `digest` was refused: a member (not in `tried`) holding the
    hash that a strict majority of the members answering at `steps` (the sender included) hold; None: no quorum."""
    votes: dict[str, list[str]] = {digest: [""]}  # the sender's own vote ("": not a member to ask)
    for p, (s, h) in sorted(answers.items()):
        if s == steps:
            votes.setdefault(h, []).append(p)
    total = sum(len(v) for v in votes.values())
    for h, holders in votes.items():
        if h != digest and 2 * len(holders) > total:
            fresh = [p for p in holders if p not in tried]
            return fresh[0] if fresh else None
    return None


def replacement_source(peers, gone: str, me: str, tried: set[str]) -> str | None:
    """Another member to take the state from in place of `gone`: a ready member of this node's role and stage
    (`peers`: net/peers.py `Peers`; the nearest first), not `me`, not one whose state a quorum refused (`tried`);
    None if there is none."""
    cands = [p for p in peers.ids(peers.role, peers.stage)
             if p not in (gone, me) and p not in tried and not peers.get(p).joining and not peers.get(p).leaving]
    rtt = {p: peers.get(p).rtt_ms for p in cands}
    return min(cands, key=lambda p: (rtt[p] is None, rtt[p] or 0.0, p), default=None)
