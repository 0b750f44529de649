"""The daemon's runtime (trio, libp2p, torch), in five rooms.

Each room imports only from the rooms listed before it (and from protocol/,
model/ and the libraries); `tests/repo/test_layering.py` checks the arrows:

* `ops/`   - what an operator and the start-up touch, about no peer: start-up
             errors and the state directory's lock (`startup`, `statedir`),
             the control socket, metrics, the event log, logging, loop lag.
* `net/`   - reaching peers: identity, addresses, the libp2p host and its
             listening side and DHT, the tensor channel and its frames, link
             emulation, the circuit relay, hole punching, dial-back, the peer
             table (`peers`), discovery and bootstrap, and `wire` (what every
             component is handed to send and refuse).
* `trust/` - who may send what: certificates (`authorize`), the signed DHT
             records, value checks on arriving frames.
* `node/`  - the node (`node/node.py`) and its training components, each
             owning its state: liveness, flows and link measurement,
             microbatches with the stage's torch worker, aggregation and the
             all-reduce, leadership, joining, resume, checkpoints, status and
             sd_notify.
* `local/` - a whole swarm of daemon processes on one machine (`swarm.py`,
             `gwtf-node local`) and its fork server (`zygote.py`).

Submodules are imported on demand (`from gwtf_node.runtime.net.host import
open_host`), so that importing `gwtf_node.runtime` stays cheap and pulls in no
libp2p.  The transport's figures are in docs/bench_transport.md.
"""
