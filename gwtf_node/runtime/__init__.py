"""The daemon's runtime (trio): the node and its components, network host, tensor channel, all-reduce.

The node (`node.py`) and its components, each owning its state (see node.py):
`peers`, `liveness`, `discovery`, `bootstrap`, `flows`, `microbatches` (with
`tensorstore`), `aggregation`, `leadership`, `joining` (with `resume` for a
relay back with a checkpoint), `data_resume`, `status`; `stage` holds this
node's part of the model and the torch worker, `wire` what every component
is handed (sending, tasks, refusals), `faults` the fault-injection hook,
`checkpoints` the state directory's checkpoint files, `statedir` its lock,
`startup` the start-up errors.

Transport layer modules (each module's docstring has its design; figures are in
docs/bench_transport.md):

* `identity`  - the node's Ed25519 key in the state directory (stable peer id)
* `frames`    - length-prefixed envelope + raw payload frames, limits checked before reading
* `host`      - py-libp2p host (Noise, Yamux, Kademlia) with `send` / `set_handler` / DHT
* `channel`   - the fast tensor channel: X25519 over libp2p, AES-256-GCM over raw TCP
* `links`     - user-space latency / bandwidth emulation per destination peer
* `allreduce` - reduce-scatter + all-gather of a float32 vector within a stage

`local` starts a whole swarm of daemon processes on one machine (`gwtf-node local`).
Submodules are imported on demand (`from gwtf_node.runtime.host import open_host`)
so that importing `gwtf_node.runtime` stays cheap and pulls in no libp2p.
"""
