"""Scaled formation in the training simulator (`TrainSimOptions.scaled_formation`, or auto's choice; the daemon's
`join --scaled-formation`, runtime/node/scaledformation.py).

With the option (or auto's choice, as the daemon's: at least 10 relays a stage) and one data node, every node at
the run's start builds the scaling machine that `protocol/flow/scaling.py` `machine_for` gives it over
the links its flow machine has (`FlowDriver._flow_config`, costs in whole
`COST_QUANTUM_MS`, as the daemon's `quantized`; the data node with every
other live node as its peers), behind a `protocol/flow/scaled.py`
`ScaledNode` that holds the flow machine: formation runs its phases, and
each node's flow machine starts holding the units formation placed there once
formation is over at that node (or with none when it was called off), taking
the flow messages that came before.  Their messages take the latency of the
link and count as flow messages; the data node opens iteration 0 once its
flows are formed (`FlowDriver._sync_flows`), as the daemon's waits for its
flow machine.  A crash reported while formation runs reaches the node's
`ScaledNode` (`remove_neighbour`: formation is called off unless the
neighbour is back within `LEFT_GRACE_S`, scaled.py), a joiner forms with the
flow machines, and its neighbours add it through their `ScaledNode`
(`add_neighbour`), as the daemon's `Scaling`.
"""

from __future__ import annotations

from ...protocol.flow import FlowNode
from ...protocol.flow.scaled import ScaledNode
from ...protocol.flow.scaling import machine_for, quantized
from .setting import MICROBATCHES


class ScaledDriver:
    """Part of `TrainSim` (driver.py): scaled formation, see the module docstring."""

    def _init_scaled(self) -> None:
        self.scaled: dict[str, ScaledNode] = {}  # node -> its formation's host (the flow machine behind it)
        self._handed: set[str] = set()  # nodes whose flow machine took formation's units (`_scaled_effects`)

    def _scaling_starts(self) -> bool:
        return bool(self._scaled and self.machines and len(self._live_data()) == 1)

    def _start_scaled(self) -> None:
        """Every live node's formation starts (module doc)."""
        live = sorted(n for n in self.nodes if n not in self.dead)
        for nid in live:
            fm = self._make_flow(nid, joined=False)
            cfg = quantized(fm.cfg)
            caps = {p: self.cap.get(p, MICROBATCHES) for p in (*cfg.next_costs, *cfg.prev_costs)}
            peers = tuple(p for p in live if p != nid)
            self.scaled[nid] = ScaledNode(fm, machine_for(cfg, caps, peers, self.S))
        for nid in live:
            self._scaled_effects(nid, self.scaled[nid].start(self.now))

    def _flow_member(self, nid: str) -> ScaledNode | FlowNode:
        """The machine that takes `nid`'s flow messages, timers and membership calls: its formation's host while
        it has one, or its flow machine."""
        return self.scaled.get(nid) or self.fnodes[nid]

    def _forming(self, nid: str) -> bool:
        """Whether `nid`'s scaled formation runs still (its flow machine has not started)."""
        host = self.scaled.get(nid)
        return host is not None and host.handed is None

    def _scaled_effects(self, nid: str, effects: list) -> None:
        """`effects` of `nid`'s formation host; once it handed over, its microbatch machine gets the flows its flow
        machine adopted (`_sync_flows` sees a change)."""
        self._apply_flow(nid, effects)
        host = self.scaled.get(nid)
        if host is not None and host.handed is not None and nid not in self._handed:
            self._handed.add(nid)
            self._fstamp.pop(nid, None)
            self._sync_flows(nid)

    def _scaled_joined(self, nid: str) -> None:
        """`nid` joins (or is back) with a flow machine of its own: no formation host any more."""
        self.scaled.pop(nid, None)

    def scaled_stats(self) -> dict:
        """Formation's figures at the data node: when it ended there, its phases, how it ended."""
        hosts = {nid: h for nid, h in self.scaled.items() if nid not in self.dead}
        lead = next((h for nid, h in hosts.items() if nid in self.data), None)
        if lead is None:
            return {}
        handed = [h.handed for h in hosts.values()]
        return {"formed_s": None if None in handed else max(handed, default=0.0), "phases": lead.scaling.phase,
                "over": sorted({str(h.formation.over) for h in hosts.values()})}
