"""The daemon's runtime (trio): network host, tensor channel, framing, link emulation, all-reduce.

Transport layer modules (see each module's docstring for the design and the
measured numbers):

* `identity`  - the node's Ed25519 key in the state directory (stable peer id)
* `frames`    - length-prefixed envelope + raw payload frames, limits checked before reading
* `host`      - py-libp2p host (Noise, Yamux, Kademlia) with `send` / `set_handler` / DHT
* `channel`   - the fast tensor channel: X25519 over libp2p, AES-256-GCM over raw TCP
* `links`     - user-space latency / bandwidth emulation per destination peer
* `allreduce` - reduce-scatter + all-gather of a float32 vector within a stage

Submodules are imported on demand (`from gwtf_node.runtime.host import open_host`)
so that importing `gwtf_node.runtime` stays cheap and pulls in no libp2p.
"""
