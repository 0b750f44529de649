#!/bin/sh
# Entry point of a compose swarm node (docker/compose.yml); not needed outside compose.
#   node.sh init                    write the run manifest to /shared/run.json (once)
#   node.sh data NAME [ITERATIONS]  the first data node: the bootstrap peer
#   node.sh relay NAME [STAGE]      a relay that joins through the data node (STAGE: auto or K)
# Every node listens on its container's own address rather than 0.0.0.0: a node announces the
# addresses it listens on (its Hello, its <state-dir>/addr file), and /ip4/0.0.0.0/... is an
# address nobody else can dial.  The data node's addr file is therefore the relays' bootstrap.
set -eu
role="$1"; name="${2:-}"
if [ "$role" = init ]; then
    [ -f /shared/run.json ] || gwtf-node init-run --out /shared/run.json
    exit 0
fi
while [ ! -f /shared/run.json ]; do sleep 1; done
state="/shared/$name"
ip=$(getent hosts "$(hostname)" | cut -d' ' -f1 | head -n 1)
[ -n "$ip" ] || { echo "node.sh: cannot tell this container's address (getent hosts $(hostname))" >&2; exit 1; }
if [ "$role" = data ]; then
    exec gwtf-node join --run /shared/run.json --role data --name "$name" --state-dir "$state" \
        --host "$ip" --port 4001 --iterations "${3:-0}"
fi
until [ -s /shared/d0/addr ]; do sleep 1; done
exec gwtf-node join --run /shared/run.json --role relay --stage "${3:-auto}" --name "$name" \
    --state-dir "$state" --host "$ip" --port 4001 --bootstrap "$(head -n 1 /shared/d0/addr)"
