"""Fuzzing every decoder: random and mutated frames per message type; only `codec.DecodeError` comes out.

One Hypothesis test per message type (parametrized over the Envelope's body
types): a random valid message of that type round-trips, and mutations of its
encoding either decode or raise `DecodeError`; `bounds.check` never raises for
whatever decodes.  Runs derandomized in CI (tests/conftest.py);
HYPOTHESIS_PROFILE=explore draws fresh examples.  The same generators drive
`scripts/fuzz_codec.py` for long runs.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gwtf_node.protocol import codec
from gwtf_node.protocol import gwtf_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import fuzz_codec  # noqa: E402  (scripts/fuzz_codec.py: the generators)


@pytest.mark.parametrize("cls", fuzz_codec.MESSAGE_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), mutations=st.integers(1, 12))
def test_decoder_of_each_type_raises_only_decode_error(cls, seed, mutations):
    rng = random.Random(seed)
    msg = fuzz_codec.random_message(cls, rng)
    valid = codec.encode("12D3KooWfuzz", msg)
    ok, back = fuzz_codec.decode_and_check(valid)
    assert ok and repr(back) == repr(msg)
    for _ in range(mutations):
        fuzz_codec.decode_and_check(fuzz_codec.mutate(valid, rng))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=256))
@example(data=b"\x08\x01" + b"\x12\x01p" + b"\xd2\x02\xff\xff\xff\xff\x0f")  # a body whose length overflows
@example(data=b"\x08\x01\xa2\x06\x00")  # Refused with every field at its default (code UNSPECIFIED)
def test_random_bytes_raise_only_decode_error(data):
    fuzz_codec.decode_and_check(data)
    header = pb.Envelope(version=codec.PROTOCOL_VERSION, sender="p").SerializeToString()
    fuzz_codec.decode_and_check(header + data)


def test_fuzz_script_reports_no_escape_on_a_short_run(capsys):
    assert fuzz_codec.fuzz(600, seed=1) == 0
    out = capsys.readouterr().out
    assert "escapes: 0" in out and "CostAnnounce" in out
