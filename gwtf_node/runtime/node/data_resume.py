"""A data node restarted with its state directory: its checkpoint, then the run's step.

1. `load_checkpoint` (before the host starts): the newest checkpoint of the
   state directory (`checkpoints.newest`), if it is a data node's part
   (stage None), is loaded: embedding, head and optimizer,
   and its steps (`LocalStage.install`).
   Until the run's step is settled the node's Hello says it is joining: the
   leader neither waits for it nor counts it in an aggregation
   (`Peers.data_nodes_ready`).
2. `take_run_step` (once it knows its peers, its phase created):

   * Other data nodes trained on without it: it downloads the data part
     from the one with the most steps, after the step of the iteration in
     flight there, as a relay joiner downloads its stage (joining.py), and
     takes part from the next iteration.  Its phase exists meanwhile (a
     BEGIN that leaves it out raises the steps it asks for), so that it can
     lead if elected: the others' iterations go on without it.
   * It is the only data node: its checkpoint should hold the relays'
     steps.  If the relays are ahead (it died after they applied a step and
     before its own checkpoint) it cannot resume exactly: it says so, by how
     many steps, and goes on from the relays' step with its embedding and
     head that many updates behind.  It goes on rather than stop because
     nobody else holds the data node's part: stopping would end the run for
     good, and a few missed updates of the embedding and the head are
     trained over.  Relays behind it (restarted from older state) catch up
     on their own side; this node keeps its step.

Then it opens the iteration of the run's step, and its microbatches are
those of that iteration (microbatches.py, "Numbering").
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..net.peers import Peers
from .stage import LocalStage

log = logging.getLogger("gwtf.node")


def load_checkpoint(stage: LocalStage, state_dir: Path) -> bool:
    """Load the newest checkpoint of a data node's part, if there is one; True if loaded (worker thread)."""
    from . import checkpoints

    ck = checkpoints.newest(state_dir, run_id=stage.manifest.run_id)
    if ck is None:
        return False
    if ck.role != "data" or ck.stage is not None:
        log.warning("not loading %s: it is not a data node's part (this node is a data node)", ck.describe())
        return False
    stage.install(ck.state, ck.steps)
    log.info("data node part loaded from %s: resuming at iteration %d", ck.describe(), ck.steps)
    return True


async def take_run_step(peers: Peers, stage: LocalStage, joining: Any, aggregation: Any, discovery: Any) -> None:
    """Settle the run's step of a data node that loaded its checkpoint (module doc); it is ready afterwards."""
    mine = stage.applied_steps
    others = [i for i in peers.infos() if i.role == "data" and not i.joining]
    if others:
        source = max(others, key=lambda i: (i.steps, i.peer_id))
        log.info("other data nodes trained on: downloading the data node part from %s (%d steps there, %d in "
                 "the checkpoint)", peers.who(source.peer_id), source.steps, mine)
        await joining.fetch_state(source.peer_id, max(mine, source.steps) + 1)  # ready from its steps after it
        return
    relays = [i for i in peers.infos() if i.role == "relay" and i.stage >= 0 and not i.joining]
    ahead = max((i.steps for i in relays), default=mine)
    if ahead > mine:
        log.warning("this data node's part holds %d steps but its relays applied %d: it is %d step(s) behind "
                    "(it died after they stepped and before its checkpoint); going on from step %d, its "
                    "embedding and head %d update(s) short of centralized training", mine, ahead, ahead - mine,
                    ahead, ahead - mine)
        stage.set_steps(ahead)
        aggregation.resynced(ahead)
    else:
        log.info("the run's step is %d: this data node's part and its relays agree", mine)
    peers.set_standing(joining=False, ready_from=stage.applied_steps)
    discovery.hello_all()
