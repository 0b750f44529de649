#!/bin/bash
# Build the gwtf-node container image without an image registry, then run it.
#
#   sudo scripts/build_image.sh [--cuda] [--keep] [--no-run]
#
# What it does, in order (each step timed):
#   1. a Debian bookworm base made with debootstrap (cached as a tarball in $GWTF_IMAGE_CACHE,
#      default /var/cache/gwtf-image) and imported with `podman import` as localhost/gwtf-base;
#   2. `podman build --isolation chroot` of docker/Dockerfile on that base, from a staged build
#      context holding the working tree and, when the host's pip finds torch's CPU wheel in a
#      local find-links directory (pip config / PIP_FIND_LINKS), that wheel in docker/wheels/;
#   3. `gwtf-node --help` and a short `gwtf-node local` swarm inside the image's filesystem:
#      `podman mount` of a container made from the image, then a chroot in a fresh network
#      namespace (loopback only) with private /proc, /dev and /tmp mounts;
#   4. removes the container, the mount, the network namespace and the staged context; the
#      image stays (localhost/gwtf-node:dev, or :cuda) unless --rm-image is given.
#
# Why not `podman run`: on hosts whose cgroups are in hybrid mode podman cannot start a container,
# while building with --isolation chroot and mounting an image's filesystem still work.  The
# CONTAINERS_CONF written below empties default_ulimits, which such hosts refuse to set.
# Needs root, podman, debootstrap and iproute2.  Not part of the test suite.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${GWTF_IMAGE_CACHE:-/var/cache/gwtf-image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
variant=cpu keep=0 run=1 rm_image=0
for arg in "$@"; do
    case "$arg" in
        --cuda) variant=cuda ;;
        --keep) keep=1 ;;
        --no-run) run=0 ;;
        --rm-image) rm_image=1 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "build_image.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
    esac
done
for tool in podman debootstrap ip chroot unshare; do
    command -v "$tool" >/dev/null || { echo "build_image.sh: $tool is missing (apt-get install podman debootstrap iproute2)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "build_image.sh: needs root (debootstrap, podman mount, ip netns)" >&2; exit 1; }

base_image=localhost/gwtf-base:bookworm
image=localhost/gwtf-node:dev
[ "$variant" = cuda ] && image=localhost/gwtf-node:cuda
work=$(mktemp -d /var/tmp/gwtf-image.XXXXXX)
netns=gwtf-image-$$
ctr=""
cleanup() {
    set +e
    [ -n "$ctr" ] && { podman umount "$ctr" >/dev/null; podman rm -f "$ctr" >/dev/null; }
    ip netns del "$netns" 2>/dev/null
    [ "$keep" = 1 ] && echo "kept $work" || rm -rf "$work"
    [ "$rm_image" = 1 ] && podman rmi -f "$image" >/dev/null
}
trap cleanup EXIT

export CONTAINERS_CONF="$work/containers.conf"
printf '[containers]\ndefault_ulimits = []\n' > "$CONTAINERS_CONF"

step_start=0
step() { step_start=$(date +%s); echo "== $1"; }
done_step() { echo "   done in $(( $(date +%s) - step_start )) s"; }

# 1. The base: a minimal bookworm.  apt-get inside the build installs Python from Debian.
step "base image $base_image"
if ! podman image exists "$base_image"; then
    mkdir -p "$cache"
    if [ ! -s "$cache/bookworm-minbase.tar" ]; then
        debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
            || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
        rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
        tar -C "$work/rootfs" -cf "$cache/bookworm-minbase.tar.part" .
        mv "$cache/bookworm-minbase.tar.part" "$cache/bookworm-minbase.tar"
        rm -rf "$work/rootfs"
    fi
    podman import --change 'CMD ["/bin/bash"]' "$cache/bookworm-minbase.tar" "$base_image" >/dev/null
fi
done_step

# 2. The staged build context: the working tree, plus a local torch wheel when pip has one.
step "build $image ($variant)"
ctx="$work/context"
mkdir -p "$ctx/docker/wheels"
cp -r "$repo/pyproject.toml" "$repo/gwtf_node" "$ctx/"
cp "$repo/docker/Dockerfile" "$repo/docker/node.sh" "$ctx/docker/"
find "$ctx" -name __pycache__ -prune -exec rm -rf {} +
torch_version=$(sed -n 's/^ARG TORCH_VERSION=//p' "$repo/docker/Dockerfile")
build_args=(--build-arg "BASE_IMAGE=$base_image")
# pip inside the build trusts what the host's pip trusts (a TLS-intercepting proxy's CA, say)
host_ca=$(pip config list 2>/dev/null | sed -n "s/.*\.cert='\(.*\)'/\1/p" | head -n 1)
host_ca=${PIP_CERT:-${host_ca:-/etc/ssl/certs/ca-certificates.crt}}
if [ -s "$host_ca" ]; then
    cp "$host_ca" "$ctx/docker/wheels/host-ca.crt"
    build_args+=(--build-arg "PIP_CERT_FILE=/tmp/wheels/host-ca.crt")
fi
if [ "$variant" = cuda ]; then
    build_args+=(--build-arg "TORCH_PIP_ARGS=--index-url https://download.pytorch.org/whl/cu128")
else
    links=$( (pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'/\1/p"; echo "${PIP_FIND_LINKS:-}") | tr ' ' '\n' | sort -u)
    for dir in $links; do
        wheel=$(ls "$dir"/torch-"$torch_version"+cpu-cp311-*.whl 2>/dev/null | head -n 1 || true)
        if [ -n "$wheel" ]; then
            echo "   torch from the local wheel $wheel"
            cp "$wheel" "$ctx/docker/wheels/"
            # the local +cpu wheel, pinned so that PyPI's CUDA build of the same release is never taken;
            # torch's own dependencies (filelock, sympy, ...) still come from PyPI
            build_args+=(--build-arg "TORCH_VERSION=$torch_version+cpu" --build-arg "TORCH_PIP_ARGS=--find-links /tmp/wheels")
            break
        fi
    done
fi
podman build --isolation chroot --network host -f "$ctx/docker/Dockerfile" "${build_args[@]}" -t "$image" "$ctx" \
    > "$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
done_step
echo "   image size: $(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"

[ "$run" = 1 ] || exit 0

# 3. Run it: a container's filesystem, chrooted, in a network namespace with only loopback.
step "run gwtf-node inside $image"
ctr=$(podman create "$image")
root=$(podman mount "$ctr")
ip netns add "$netns"
ip netns exec "$netns" ip link set lo up
inner='set -e
gwtf-node --help > /dev/null && echo "   gwtf-node --help: ok"
gwtf-node local --stages 2 --relays-per-stage 1 --iterations 2 --microbatches 2 --workdir /tmp/swarm'
# The mounts live in a private mount namespace and vanish with it.
ip netns exec "$netns" unshare --mount --propagation private --pid --fork /bin/sh -c '
    root="$1"
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/tmp"
    exec chroot "$root" /usr/bin/env -i PATH=/opt/gwtf/bin:/usr/bin:/bin HOME=/tmp /bin/sh -c "$2"
' sh "$root" "$inner"
done_step
