"""A state hand-over checked against a quorum of the stage's members (runtime/node/handover.py), over the real wire.

In one process: relay daemons (`Node.run`) serving stage 0, one of them
hostile (its weights were tampered with, so the state it serves and the hash
it answers are not the stage's), and a joiner of stage 0 that downloads the
stage's state from the hostile member first.  With one honest member beside
the hostile one there is no quorum: the joiner loads nothing and says so
(`Joining.handover`), the hostile state is refused.  Once a second honest
member has joined the stage, the joiner's next try refuses the hostile
state again, this time outvoted, and takes the state from an honest member:
the joiner then holds the honest members' weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.node import joining
from gwtf_node.runtime.node.handover import next_source
from gwtf_node.runtime.node.node import Node, NodeOptions

from support.helpers import until

DEADLINE_S = 120


async def _start_relay(nursery: trio.Nursery, nodes: dict, run: Path, workdir: Path, name: str,
                       boot: str | None) -> Node:
    """A stage-0 relay daemon `name` in `nursery` (kept in `nodes`); returns once it listens with its stage built."""
    node = Node(NodeOptions(run_path=run, role="relay", stage=0, state_dir=workdir / name, name=name,
                            bootstrap=[boot] if boot else [], insecure_unsigned=True,
                            bootstrap_timeout_s=0, settle_s=0.2))
    nodes[name] = node
    nursery.start_soon(node.run)
    await until(lambda: node.parts is not None and (workdir / name / "addr").exists() and node.stage.built,
                f"{name} listens with its stage built")
    return node


def test_the_next_source_holds_the_hash_of_a_strict_majority() -> None:
    assert next_source(5, "bad", {"a": (5, "h"), "b": (5, "h")}, set()) == "a"
    assert next_source(5, "bad", {"a": (5, "h"), "b": (5, "h")}, {"a"}) == "b"
    assert next_source(5, "bad", {"a": (5, "h")}, set()) is None  # one against one: no quorum
    assert next_source(5, "bad", {"a": (5, "h"), "b": (5, "x")}, set()) is None  # nobody holds a majority
    assert next_source(5, "bad", {"a": (5, "h"), "b": (6, "h"), "c": (5, "bad")}, set()) is None
    assert next_source(5, "bad", {"a": (5, "h"), "b": (5, "h"), "c": (5, "bad")}, set()) is None  # 2 of 4
    assert next_source(5, "bad", {"a": (5, "h"), "b": (5, "h"), "c": (5, "h"), "d": (5, "bad")}, set()) == "a"


@pytest.mark.trio
async def test_a_joiner_refuses_a_tampered_state_and_takes_the_stage_state_from_an_honest_member(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(joining, "NO_QUORUM_RETRY_S", 1.0)  # ask again soon after a hand-over without quorum
    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    nodes: dict[str, Node] = {}
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            async def start(name: str, boot: str | None) -> Node:
                return await _start_relay(nursery, nodes, run, tmp_path, name, boot)

            honest = await start("honest", None)
            boot = (tmp_path / "honest" / "addr").read_text().split()[0]
            hostile = await start("hostile", boot)
            joiner = await start("joiner", boot)

            def tamper() -> None:
                with torch.no_grad():
                    for p in hostile.stage.model.params:
                        p.add_(0.25)

            await trio.to_thread.run_sync(tamper)
            ids = {n: node.parts.wire.me for n, node in nodes.items()}
            assert hostile.stage.model.state_hash() != honest.stage.model.state_hash()
            await until(lambda: {ids["honest"], ids["hostile"]} <= set(joiner.peers.ids("relay", 0)),
                        "the joiner knows the stage's members")

            nursery.start_soon(joiner.parts.joining.fetch_state, ids["hostile"], 0)
            # one honest member against the hostile one: no quorum, nothing loaded
            await until(lambda: (joiner.parts.joining.handover or {}).get("no_quorum"), "no quorum is found")
            assert not joiner.parts.joining.state_loaded.is_set()
            assert joiner.parts.joining.handover["taken"] is False
            assert joiner.parts.wire.refused_by.get("INVALID", 0) >= 1  # the refused StageState

            # a second honest member joins the stage: the next try outvotes the hostile state
            second = await start("honest2", boot)
            ids["honest2"] = second.parts.wire.me
            await until(lambda: ids["honest2"] in joiner.peers.ids("relay", 0), "the joiner knows the new member")
            with trio.fail_after(60):
                await joiner.parts.joining.state_loaded.wait()
            h = joiner.parts.joining.handover
            assert h["taken"] and h["source"] in (ids["honest"], ids["honest2"]), h
            assert joiner.stage.model.state_hash() == honest.stage.model.state_hash() \
                == second.stage.model.state_hash() != hostile.stage.model.state_hash()
            for node in nodes.values():
                node.stop()


@pytest.mark.trio
async def test_a_joiner_whose_state_source_dies_before_answering_takes_the_state_from_another_member(
        tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    nodes: dict[str, Node] = {}
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            async def start(name: str, boot: str | None) -> Node:
                return await _start_relay(nursery, nodes, run, tmp_path, name, boot)

            a = await start("a", None)
            boot = (tmp_path / "a" / "addr").read_text().split()[0]
            silent = await start("silent", boot)
            joiner = await start("joiner", boot)
            ids = {n: node.parts.wire.me for n, node in nodes.items()}
            await until(lambda: {ids["a"], ids["silent"]} <= set(joiner.peers.ids("relay", 0)),
                        "the joiner knows the stage's members")
            asked = trio.Event()

            async def never_answer(peer, msg) -> None:
                asked.set()
                await trio.sleep_forever()

            silent.parts.joining._answer_state_request = never_answer
            nursery.start_soon(joiner.parts.joining.fetch_state, ids["silent"], 0)
            with trio.fail_after(30):
                await asked.wait()
            silent.stop()  # dies holding the request
            await until(lambda: joiner.peers.is_gone(ids["silent"]), "the joiner finds the source gone", 30)
            with trio.fail_after(30):  # not the 600 s a source is given to answer
                await joiner.parts.joining.state_loaded.wait()
            assert joiner.parts.joining.fetch_source == ids["a"]
            assert joiner.parts.joining.handover["source"] == ids["a"], joiner.parts.joining.handover
            assert joiner.stage.model.state_hash() == a.stage.model.state_hash()
            for node in nodes.values():
                node.stop()
