#!/bin/sh
# Entry point of a compose swarm node (docker/compose.yml); not needed outside compose.
#   node.sh init                    write the run manifest to /shared/run.json (once)
#   node.sh data NAME [ITERATIONS]  the first data node: the bootstrap peer
#   node.sh relay NAME [STAGE]      a relay that joins through the data node (STAGE: auto or K)
# The data node writes its multiaddr to /shared/<name>/addr; relays wait for it and dial it by
# the data node's container address (its own addr file says 0.0.0.0, which nobody can dial).
set -eu
role="$1"; name="${2:-}"
if [ "$role" = init ]; then
    [ -f /shared/run.json ] || gwtf-node init-run --out /shared/run.json
    exit 0
fi
while [ ! -f /shared/run.json ]; do sleep 1; done
state="/shared/$name"
if [ "$role" = data ]; then
    exec gwtf-node join --run /shared/run.json --role data --name "$name" --state-dir "$state" \
        --host 0.0.0.0 --port 4001 --iterations "${3:-0}"
fi
until [ -s /shared/d0/addr ]; do sleep 1; done
peer_id=$(head -n 1 /shared/d0/addr | sed 's#.*/p2p/##')
d0_ip=$(getent hosts d0 | cut -d' ' -f1)
exec gwtf-node join --run /shared/run.json --role relay --stage "${3:-auto}" --name "$name" \
    --state-dir "$state" --host 0.0.0.0 --bootstrap "/ip4/$d0_ip/tcp/4001/p2p/$peer_id"
