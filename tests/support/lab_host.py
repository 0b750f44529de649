"""A host of the network lab tests (tests/lab/test_reach_lab.py), run inside a namespace.

    python tests/support/lab_host.py STATE_DIR LISTEN [BOOTSTRAP]

Prints one JSON line with its addresses once listening.  Without BOOTSTRAP
(the public side) it waits for a payload frame, answers its sender with one,
and prints what it knows about that peer; with BOOTSTRAP (the home side) it
sends a payload frame to the bootstrap peer, waits for the answer, and prints
the same.  Every wait has a deadline; the exit status is 0 on success.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from gwtf_node.runtime.net.host import open_host

DEADLINE_S = 40
PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


async def main(state: str, listen: str, bootstrap: str | None) -> None:
    got: list[tuple[str, bytes]] = []
    arrived = trio.Event()

    async def handler(peer: str, envelope: bytes, payload) -> None:
        got.append((peer, bytes(payload)))
        arrived.set()

    with trio.fail_after(DEADLINE_S):
        async with open_host(Path(state), listen=[listen], bootstrap=[bootstrap] if bootstrap else [],
                             dht=False, tensor_port=None) as host:
            host.set_handler(handler)
            print(json.dumps({"peer_id": host.peer_id, "addrs": host.addrs, "tensor": host.tensor_addr}), flush=True)
            if bootstrap:
                other = bootstrap.rsplit("/p2p/", 1)[1]
                await host.send(other, b"from home", PAYLOAD, wait_delivered=True)
                await arrived.wait()
            else:
                await arrived.wait()
                other = got[0][0]
                await host.send(other, b"from public", PAYLOAD, wait_delivered=True)
            print(json.dumps({"kind": host.connection_kind(other), "path": host.payload_path(other),
                              "intact": got[0][1] == PAYLOAD, "hello_addrs": host.addrs_for(other)}), flush=True)
            if not bootstrap:
                await trio.sleep(3)  # the home side reads our frame before we close the connection


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
