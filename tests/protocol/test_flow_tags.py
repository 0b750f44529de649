"""Residual-path tags (protocol/flow/labels.py `node_tag`): short ids stay themselves, long peer ids shrink, and a
cost announcement of a long path stays small on the wire."""

from __future__ import annotations

import random

from gwtf_node.protocol.codec import encode
from gwtf_node.protocol.flow.config import FlowConfig
from gwtf_node.protocol.flow.labels import LabelState, node_tag
from gwtf_node.protocol.messages import CostAnnounce, Label, Side

ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def peer_id(rng: random.Random) -> str:
    return "12D3KooW" + "".join(rng.choice(ALPHABET) for _ in range(44))  # a libp2p Ed25519 peer id's shape


def test_short_ids_are_their_own_tags_and_long_ones_shrink() -> None:
    rng = random.Random(0)
    assert node_tag("r3_1") == "r3_1" and node_tag("d0") == "d0"  # the simulator's ids: its traces unchanged
    ids = {peer_id(rng) for _ in range(2000)}
    tags = {node_tag(i) for i in ids}
    assert len(tags) == len(ids)  # distinct
    assert all(len(t) == 11 for t in tags)
    some = next(iter(ids))
    assert node_tag(some) == node_tag(str(some))  # a function of the id alone: every node computes the same


def test_a_node_tags_its_own_sides_with_its_tag() -> None:
    me = peer_id(random.Random(1))
    cfg = FlowConfig(me, False, 1, ("D",), {}, {})
    state = LabelState.of(cfg)
    assert (state.tag_in, state.tag_out) == (node_tag(me) + "+", node_tag(me) + "-")


def test_a_sixteen_stage_path_of_peer_ids_costs_a_few_hundred_bytes() -> None:
    rng = random.Random(2)
    nodes = [peer_id(rng) for _ in range(17)]
    path = tuple(node_tag(n) + side for n in nodes for side in ("+", "-"))
    full = tuple(n + side for n in nodes for side in ("+", "-"))
    small = len(encode(nodes[1], CostAnnounce((Label(nodes[0], Side.IN, 3.5, path, epoch=4),))))
    large = len(encode(nodes[1], CostAnnounce((Label(nodes[0], Side.IN, 3.5, full, epoch=4),))))
    assert small < 700 and large > 3 * small, (small, large)  # 605 against 1,999 bytes
