"""A frame whose handler raises something other than `FrameRefused` (a fault of the receiving node, not of the
peer) is logged with its traceback, counted by message type, and dropped; the node runs on and handles the next
frame (runtime/node/routes.py `handler_fault`).  Two daemons' components on an in-memory wire (test_readmit.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.node.routes import RAISE_FAULTS_ENV

from test_readmit import _node


async def _pair(tmp_path: Path, nursery: trio.Nursery):
    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    net: dict = {}
    relay = _node(tmp_path, run, "r0", "R0", "relay", 0, net, nursery)
    data = _node(tmp_path, run, "d0", "D0", "data", None, net, nursery)
    await data.parts.discovery.dial(relay.parts.discovery.host.addrs[0])
    await trio.testing.wait_all_tasks_blocked()
    assert "D0" in relay.peers
    relay.parts.leadership.leader_of_term.return_value = (None, 0)  # (the authorizer asks: no leader yet)
    relay.parts.flows.on_link_cost.side_effect = AttributeError("'ScaleAbort' object has no attribute 'credit'")
    return relay, data


@pytest.mark.trio
async def test_a_handler_fault_is_logged_counted_and_the_node_runs_on(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.delenv(RAISE_FAULTS_ENV, raising=False)
    caplog.set_level(logging.ERROR, logger="gwtf.node")
    async with trio.open_nursery() as nursery:
        relay, data = await _pair(tmp_path, nursery)
        assert await data.parts.wire.send("R0", m.LinkCost(3.5))
        assert await data.parts.wire.send("R0", m.LinkCost(4.0))
        relay.parts.flows.on_link_cost.side_effect = None
        assert await data.parts.wire.send("R0", m.LinkCost(4.5))  # handled as ever
        nursery.cancel_scope.cancel()
    assert relay.parts.wire.handler_faults == {"LinkCost": 2} and relay.parts.wire.refused == 0
    assert [c.args[1] for c in relay.parts.flows.on_link_cost.call_args_list] == [m.LinkCost(c) for c in (3.5, 4, 4.5)]
    faults = [r for r in caplog.records if "its handling in flows failed" in r.getMessage()]
    assert len(faults) == 2 and faults[0].exc_info is not None and "LinkCost from d0" in faults[0].getMessage()


@pytest.mark.trio
async def test_in_the_tests_a_handler_fault_is_raised(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(RAISE_FAULTS_ENV, "1")
    async with trio.open_nursery() as nursery:
        relay, _data = await _pair(tmp_path, nursery)
        with pytest.raises(AttributeError, match="no attribute 'credit'"):
            await relay._on_frame("D0", codec.encode("", m.LinkCost(3.5)), b"")  # (as the host delivers a frame)
        nursery.cancel_scope.cancel()
    assert relay.parts.wire.handler_faults == {}


def test_the_variable_is_no_setting_of_the_cli() -> None:
    """The tests set it for every daemon they start: `join` does not warn of it as an unknown setting, nor of the
    fault injection's variables."""
    from gwtf_node.cli.config import NOT_SETTINGS
    from gwtf_node.runtime.node.faults import ENV_VARS

    assert RAISE_FAULTS_ENV in NOT_SETTINGS
    assert {"GWTF_POISON_GRAD", "GWTF_BUSY_STEP", "GWTF_ALONE_AT"} <= set(ENV_VARS) <= NOT_SETTINGS
