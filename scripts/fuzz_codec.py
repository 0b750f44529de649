"""Fuzz the wire codec: random and mutated frames through `codec.decode` and `bounds.check`.

For every message type of the Envelope it builds random valid messages
(every field drawn over its proto type's whole range, repeated fields and
nested messages included), encodes them, and decodes:

* the valid encoding (it must decode to the same message),
* mutations of it (bytes flipped, inserted, deleted, the frame cut short or
  spliced with another frame, varints made huge),
* and random byte strings, some of them prefixed with a valid Envelope header.

Only `codec.DecodeError` may come out of `codec.decode`, and `bounds.check`
must return (never raise) for whatever decodes, with an empty context and
with a context holding numbers.  Every other exception is an *escape*: it is
printed with the input that caused it, and the exit status is 1.

    python scripts/fuzz_codec.py --inputs 100000 --seed 0

prints, per message type, the inputs tried, how many decoded and how many
were refused, then the number of escapes.  tests/protocol/test_fuzz_codec.py uses the
same generators under Hypothesis.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from collections import Counter
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from gwtf_node.protocol import bounds, codec
from gwtf_node.protocol import gwtf_pb2 as pb
from gwtf_node.protocol import messages as m

MESSAGE_TYPES: list[type] = sorted(codec._BODY_FIELD, key=lambda c: c.__name__)
_INT_RANGES = {
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
}
_SPECIAL_FLOATS = (0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), 1e308, -1e308, 5e-324, 1e7, -1e7, 1e6 + 1)
_WORDS = ("", "data", "relay", "float32", "float16", "uint8", "bfloat16", "int64", "s0/it1", "x" * 300,
          "12D3KooWQ", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooW", "é", "\x00")


def _int(rng: random.Random, lo: int, hi: int) -> int:
    r = rng.random()
    if r < 0.4:
        return rng.randint(max(lo, 0), min(hi, 8))
    if r < 0.55:
        return rng.choice([lo, hi, max(lo, 0), min(hi, 1 << 20), min(hi, (1 << 32) - 1)])
    return rng.randint(lo, hi)


def _float(rng: random.Random) -> float:
    r = rng.random()
    if r < 0.3:
        return rng.choice(_SPECIAL_FLOATS)
    if r < 0.6:
        return rng.uniform(-100, 100)
    return rng.uniform(-1, 1) * 10 ** rng.randint(-30, 300)


def _string(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(_WORDS)
    return "".join(chr(rng.randint(32, 0x2FF)) for _ in range(rng.randint(0, 20)))


def _fill(rng: random.Random, desc, depth: int = 0) -> dict[str, Any]:
    """Keyword arguments of the dataclass of proto message `desc`, drawn at random (valid for the codec)."""
    kwargs: dict[str, Any] = {}
    for f in desc.fields:
        n = rng.choice([0, 0, 1, 2, 3, rng.randint(0, 40)]) if f.is_repeated else 1

        def one():
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                if f.message_type.name == codec._PAIR_MESSAGE:
                    return (_string(rng), _float(rng))
                return getattr(m, f.message_type.name)(**_fill(rng, f.message_type, depth + 1))
            if f.type == FieldDescriptor.TYPE_ENUM:
                return rng.choice(list(codec._ENUMS[f.enum_type.name]))
            if f.type in _INT_RANGES:
                return _int(rng, *_INT_RANGES[f.type])
            if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
                return _float(rng)
            if f.type == FieldDescriptor.TYPE_BOOL:
                return rng.random() < 0.5
            if f.type == FieldDescriptor.TYPE_BYTES:
                return bytes(rng.randrange(256) for _ in range(rng.randint(0, 24)))
            return _string(rng)

        if f.is_repeated:
            kwargs[f.name] = tuple(one() for _ in range(n if depth < 2 else min(n, 2)))
        elif f.type == FieldDescriptor.TYPE_MESSAGE and rng.random() < 0.2:
            kwargs[f.name] = None  # an optional message left out
        else:
            kwargs[f.name] = one()
    return kwargs


def random_message(cls: type, rng: random.Random) -> Any:
    """A random message of type `cls` that the codec can encode."""
    return cls(**_fill(rng, getattr(pb, cls.__name__).DESCRIPTOR))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def mutate(data: bytes, rng: random.Random, other: bytes = b"") -> bytes:
    """`data` with one to four random changes (flip, insert, delete, cut, splice, huge varint)."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            j = min(i, len(b) - 1)
            b[j] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and b:
            del b[i:i + rng.randint(1, 8)]
        elif op == 3:
            del b[i:]
        elif op == 4 and other:
            j = rng.randrange(len(other) + 1)
            b = b[:i] + bytearray(other[j:])
        elif op == 5:
            b[i:i] = _varint(rng.choice([(1 << 64) - 1, 1 << 63, (1 << 32) + 7, 1 << 31]))
        elif op == 6 and b:
            j = min(i, len(b) - 1)
            b[j] = rng.choice([0x00, 0x7F, 0x80, 0xFF])
    return bytes(b)


def random_bytes(rng: random.Random) -> bytes:
    """Random bytes, half of them after a valid Envelope header (version 1, a sender)."""
    body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if rng.random() < 0.5:
        return pb.Envelope(version=codec.PROTOCOL_VERSION, sender="p").SerializeToString() + body
    return body


_NUMERIC_CONTEXT = bounds.Context(n_stages=3, iteration=5, term=2, epochs={"p": 3}, sender_capacity=4,
                                  units_from_sender=1, hidden_shape=(2, 8, 16), hidden_dtype="float32",
                                  grad_len=1000)


def decode_and_check(data: bytes) -> tuple[bool, Any]:
    """(decoded?, message or None); raises whatever escapes the codec or the bounds (not DecodeError)."""
    try:
        _sender, msg = codec.decode(data)
    except codec.DecodeError:
        return False, None
    bounds.check(msg, bounds.Context())
    bounds.check(msg, _NUMERIC_CONTEXT)
    return True, msg


def fuzz(inputs: int, seed: int, out=None) -> int:
    """Run `inputs` inputs over all decoders; returns the number of escapes."""
    out = out or sys.stdout
    rng = random.Random(seed)
    tried, decoded = Counter(), Counter()
    escapes: list[tuple[str, bytes, str]] = []
    per_type = max(1, inputs // (len(MESSAGE_TYPES) + 1))
    last = b""
    for cls in MESSAGE_TYPES + [None]:
        name = cls.__name__ if cls is not None else "(random bytes)"
        for i in range(per_type if cls is not None else inputs - per_type * len(MESSAGE_TYPES)):
            if cls is None:
                data = random_bytes(rng)
            else:
                msg = random_message(cls, rng)
                valid = codec.encode("12D3KooWfuzz", msg)
                if i % 8 == 0:
                    sender, back = codec.decode(valid)
                    if back != msg and not _same_with_nan(back, msg):
                        escapes.append((name, valid, f"round trip changed the message: {msg!r} -> {back!r}"))
                    data = valid
                else:
                    data = mutate(valid, rng, last)
                last = valid
            tried[name] += 1
            try:
                ok, _ = decode_and_check(data)
                decoded[name] += ok
            except Exception:  # noqa: BLE001 - an escape: recorded with its input
                escapes.append((name, data, traceback.format_exc(limit=3)))
    width = max(len(n) for n in tried)
    print(f"{'message type':<{width}}  {'inputs':>8}  {'decoded':>8}  {'refused':>8}", file=out)
    for name in tried:
        print(f"{name:<{width}}  {tried[name]:>8}  {decoded[name]:>8}  {tried[name] - decoded[name]:>8}", file=out)
    print(f"{'total':<{width}}  {sum(tried.values()):>8}  {sum(decoded.values()):>8}  "
          f"{sum(tried.values()) - sum(decoded.values()):>8}", file=out)
    print(f"escapes: {len(escapes)}", file=out)
    for name, data, why in escapes[:10]:
        print(f"--- {name}: input {data.hex()}\n{why}", file=out)
    return len(escapes)


def _same_with_nan(a: Any, b: Any) -> bool:
    return repr(a) == repr(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    escapes = fuzz(a.inputs, a.seed)
    print(f"{a.inputs} inputs in {time.perf_counter() - t0:.1f} s (seed {a.seed})")
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())
