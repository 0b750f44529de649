"""The network lab from the command line (gwtf_node/testing/netlab.py), for trying things by hand.

    sudo python scripts/netlab.py up [--public 2] [--homes 2] [--hosts 1] [--rate MBIT]

Builds the lab, prints each node (name, address, the address the internet
sees, and the `ip netns exec` prefix to run a command there), and keeps it
until Ctrl-C or SIGTERM, when every namespace and process in it is removed.
Example, in another shell: `ip netns exec <ns of p0> gwtf-node join ... --listen 0.0.0.0:4001`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from gwtf_node.testing.netlab import NetLab, lab_unavailable


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build a lab and keep it until Ctrl-C")
    up.add_argument("--public", type=int, default=2, help="public nodes (p0, p1, ...)")
    up.add_argument("--homes", type=int, default=2, help="home networks behind NAT routers (a, b, ...)")
    up.add_argument("--hosts", type=int, default=1, help="hosts behind each router")
    up.add_argument("--rate", type=float, default=None, metavar="MBIT", help="tbf rate of every node's uplink")
    args = p.parse_args(argv)
    why = lab_unavailable()
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    if not (0 <= args.public <= 200 and 0 <= args.homes <= 26 and 1 <= args.hosts <= 200):
        print("error: --public 0..200, --homes 0..26, --hosts 1..200", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with NetLab() as lab:
        nodes = [lab.public(f"p{i}") for i in range(args.public)]
        for h in range(args.homes):
            nodes += lab.home(chr(ord("a") + h), args.hosts).hosts
        for node in nodes:
            if args.rate:
                lab.shape(node, args.rate)
            print(f"{node.name:8} {node.ip:15} seen as {node.public_ip:15} ip netns exec {node.ns}", flush=True)
        print(f"lab {lab.prefix} is up; Ctrl-C removes it", flush=True)
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
    print("removed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
