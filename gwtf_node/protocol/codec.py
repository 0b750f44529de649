"""Wire codec: the dataclasses of `messages.py` <-> protobuf `Envelope` frames.

Every frame on a stream is one `gwtf.v1.Envelope` (`protos/gwtf.proto`):
a protocol version, the sender's peer id and a `oneof body` holding one
message.  On a libp2p connection the sender is left empty (`encode("", msg)`):
the connection's secure channel authenticates the peer, and 54 bytes of peer
id would be most of a small frame (a Ping is 8 bytes without it); a receiver
takes the authenticated peer for the sender, and refuses a frame whose
non-empty sender names another.  `encode` and `decode` are the only way the
runtime turns messages into bytes and back, and pair tests go through them
too, so the wire format is exercised by the code that the daemon runs.

Conversion is driven by the schema rather than written out per message: a
dataclass and the proto message of the same name have the same field names
(tests/protocol/test_protos.py checks it), and each field converts by its proto type.
Enums map by `_ENUMS` (proto `Outcome` is the Python `Reply`); a repeated
`PeerCost` is a tuple of `(peer, cost)` pairs; a singular message field is
optional (`None` when absent); a repeated field is a tuple.  Adding a field
or a message is thus an edit of messages.py and gwtf.proto (plus a line in
the Envelope `oneof`), then `python scripts/gen_protos.py`.

A frame comes from a peer we do not trust, so `decode` checks what the
protocol machines assume and reports each problem as a `DecodeError` (data,
not a crash): a frame longer than `MAX_FRAME_BYTES` (checked before parsing,
so an oversized frame costs no parsing work), bytes that are not an
Envelope, a version we do not speak, an empty or unknown body (a message
added by a newer peer parses as an unknown field, hence an empty body), an
enum value that is unknown or left at 0 (`*_UNSPECIFIED`), and a NaN double
(NaN compares false with everything and would poison min-cost choices;
+/-infinity is allowed and means "no route").  Encoding something that is
not a wire message, or that would exceed the frame limit, is our own bug
and raises `EncodeError`.

The codec is pure: it imports protobuf and our messages, nothing else.
"""

from __future__ import annotations

import enum
import math
import typing
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError as _ProtobufDecodeError
from google.protobuf.message import Message as _PbMessage

from . import gwtf_pb2 as pb
from . import messages
from .messages import DenyReason, Message, PhaseKind, RefusalCode, Reply, Side

PROTOCOL_VERSION = 2  # Envelope.version this node sends and accepts (2: the sender left out on a connection)
# Largest Envelope accepted or sent.  Control messages are tens to hundreds of
# bytes; a CostAnnounce or FlowReport of a busy node stays far below this.  The
# limit bounds what a peer can make us allocate and parse; tensors never travel
# inside an Envelope (they follow a TensorHeader as raw bytes).
MAX_FRAME_BYTES = 1 << 20  # 1 MiB

_ENUMS: dict[str, type[enum.IntEnum]] = {"Side": Side, "Outcome": Reply, "DenyReason": DenyReason,
                                         "PhaseKind": PhaseKind, "RefusalCode": RefusalCode}
_PAIR_MESSAGE = "PeerCost"  # repeated PeerCost <-> tuple[tuple[str, float], ...]

_BODY = pb.Envelope.DESCRIPTOR.oneofs_by_name["body"]
# dataclass -> name of its field in Envelope.body
_BODY_FIELD: dict[type, str] = {
    cls: f.name
    for f in _BODY.fields
    if (cls := getattr(messages, f.message_type.name, None)) in typing.get_args(Message)
}
_CLASS_OF_FIELD: dict[str, type] = {name: cls for cls, name in _BODY_FIELD.items()}


class DecodeError(ValueError):
    """A frame from a peer that is not a valid message; the text says what is wrong."""


class EncodeError(ValueError):
    """A message we cannot put on the wire: a bug on our side."""


# ---- dataclass -> protobuf ------------------------------------------------


def _fill(obj: Any, out: _PbMessage) -> None:
    """Copy the fields of dataclass `obj` into the empty proto message `out`."""
    for f in out.DESCRIPTOR.fields:
        value = getattr(obj, f.name)
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if f.message_type.name == _PAIR_MESSAGE:
                for peer, cost in value:
                    getattr(out, f.name).add(peer=peer, cost=cost)
            elif f.is_repeated:
                for item in value:
                    _fill(item, getattr(out, f.name).add())
            elif value is not None:
                sub = getattr(out, f.name)
                sub.SetInParent()  # present even when every field is at its default
                _fill(value, sub)
        elif f.is_repeated:
            getattr(out, f.name).extend(value)
        elif f.type == FieldDescriptor.TYPE_ENUM:
            setattr(out, f.name, int(value))
        else:
            setattr(out, f.name, value)


def encode(sender: str, msg: Message) -> bytes:
    """One Envelope frame carrying `msg` from `sender` (a peer id; "": the connection says who)."""
    field = _BODY_FIELD.get(type(msg))
    if field is None:
        known = ", ".join(sorted(c.__name__ for c in _BODY_FIELD))
        raise EncodeError(f"cannot encode a {type(msg).__name__}: only {known} go on the wire")
    envelope = pb.Envelope(version=PROTOCOL_VERSION, sender=sender)
    body = getattr(envelope, field)
    body.SetInParent()  # selects the oneof field even when every field of `msg` is at its default
    try:
        _fill(msg, body)
    except (TypeError, ValueError) as e:  # protobuf's own checks: wrong type, int out of range
        raise EncodeError(f"cannot encode {msg!r}: {e}") from e
    data = envelope.SerializeToString()
    if len(data) > MAX_FRAME_BYTES:
        raise EncodeError(
            f"{type(msg).__name__} encodes to {len(data)} bytes, over the {MAX_FRAME_BYTES}-byte frame "
            "limit that peers enforce: split it into smaller messages"
        )
    return data


# ---- protobuf -> dataclass ------------------------------------------------


def _scalar(f: FieldDescriptor, value: Any, where: str) -> Any:
    if f.type == FieldDescriptor.TYPE_ENUM:
        py_enum = _ENUMS[f.enum_type.name]
        try:
            return py_enum(value)
        except ValueError:
            known = ", ".join(f"{m.name}={m.value}" for m in py_enum)
            raise DecodeError(f"{where} is {value}, not a known {py_enum.__name__} (known: {known})") from None
    if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT) and math.isnan(value):
        raise DecodeError(f"{where} is NaN; costs must be numbers or +/-infinity")
    return value


def _read(p: _PbMessage, where: str) -> Any:
    """The dataclass of the same name as proto message `p`, field by field."""
    cls = getattr(messages, p.DESCRIPTOR.name)
    kwargs: dict[str, Any] = {}
    for f in p.DESCRIPTOR.fields:
        value = getattr(p, f.name)
        at = f"{where}.{f.name}"
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if f.message_type.name == _PAIR_MESSAGE:
                kwargs[f.name] = tuple(
                    (pair.peer, _scalar(pair.DESCRIPTOR.fields_by_name["cost"], pair.cost, f"{at}[{i}].cost"))
                    for i, pair in enumerate(value)
                )
            elif f.is_repeated:
                kwargs[f.name] = tuple(_read(item, f"{at}[{i}]") for i, item in enumerate(value))
            else:
                kwargs[f.name] = _read(value, at) if p.HasField(f.name) else None
        elif f.is_repeated:
            kwargs[f.name] = tuple(_scalar(f, v, f"{at}[{i}]") for i, v in enumerate(value))
        else:
            kwargs[f.name] = _scalar(f, value, at)
    return cls(**kwargs)


def decode(data: bytes) -> tuple[str, Message]:
    """The sender ("" if left out) and the message of one Envelope frame; `DecodeError` if it is not a valid one."""
    if len(data) > MAX_FRAME_BYTES:
        raise DecodeError(f"frame of {len(data)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    envelope = pb.Envelope()
    try:
        envelope.ParseFromString(data)
    except (_ProtobufDecodeError, UnicodeDecodeError) as e:  # the pure-Python backend raises the latter
        raise DecodeError(f"frame of {len(data)} bytes is not a gwtf.v1.Envelope: {e}") from None
    if envelope.version != PROTOCOL_VERSION:
        raise DecodeError(
            f"frame has protocol version {envelope.version}, this node speaks version {PROTOCOL_VERSION}"
        )
    field = envelope.WhichOneof("body")
    if field is None or field not in _CLASS_OF_FIELD:
        raise DecodeError(
            "frame has no message body (empty, or a message type this node does not know: "
            "the sender may run a newer gwtf-node)"
        )
    body = getattr(envelope, field)
    return envelope.sender, _read(body, body.DESCRIPTOR.name)

