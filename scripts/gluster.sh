#!/usr/bin/env bash
# A GlusterFS volume on this one machine, mounted twice as two "hosts", for
# plfs's cross-host tests and benchmarks.
#
#   scripts/gluster.sh start    # glusterd, volume of two bricks, two mounts
#   scripts/gluster.sh stop     # unmount both, stop and delete the volume
#   scripts/gluster.sh status   # prints the two mount points, or fails
#
# `start` is idempotent and serialised (tests of several processes call it
# at once) and prints the two mount points, one a line: host A, host B.
# It exits 2, saying why on stderr, where Gluster cannot run here (not
# root, packages missing and not installable, glusterd does not start):
# callers skip loudly on that.
#
# Cross-mount consistency needs Gluster's metadata caches off: the volume
# gets performance.stat-prefetch, quick-read (and the other client-side
# caches) off, and both mounts attribute-timeout=0, entry-timeout=0,
# negative-timeout=0.
set -euo pipefail

ROOT=${MAPFS_GLUSTER_DIR:-/var/tmp/mapfs-gluster}
VOL=${MAPFS_GLUSTER_VOLUME:-mapfs}
HOST=$(hostname)
A=$ROOT/host-a
B=$ROOT/host-b
MOUNT_OPTS=attribute-timeout=0,entry-timeout=0,negative-timeout=0

cant() {
    echo "gluster.sh: Gluster cannot run here: $*" >&2
    exit 2
}

is_mounted() { findmnt -n -t fuse.glusterfs "$1" >/dev/null 2>&1; }

ensure_packages() {
    command -v glusterd >/dev/null 2>&1 && command -v glusterfs >/dev/null 2>&1 && return
    [ "$(id -u)" -eq 0 ] || cant "glusterfs-server/glusterfs-client are not installed and we are not root"
    echo "gluster.sh: installing glusterfs-server glusterfs-client" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq glusterfs-server glusterfs-client >/dev/null; } ||
        cant "apt-get install glusterfs-server glusterfs-client failed"
}

ensure_glusterd() {
    if gluster --mode=script pool list >/dev/null 2>&1; then return; fi
    mkdir -p "$ROOT"
    # 9>&-: the daemons must not inherit the lock of this script.
    setsid glusterd -p "$ROOT/glusterd.pid" --log-file="$ROOT/glusterd.log" 9>&- ||
        cant "glusterd failed to start (see $ROOT/glusterd.log)"
    for _ in $(seq 50); do
        gluster --mode=script pool list >/dev/null 2>&1 && return
        sleep 0.2
    done
    cant "glusterd does not answer (see $ROOT/glusterd.log)"
}

ensure_volume() {
    if ! gluster --mode=script volume info "$VOL" >/dev/null 2>&1; then
        mkdir -p "$ROOT/bricks/1" "$ROOT/bricks/2"
        # `force`: bricks on the root file system of one host.
        gluster --mode=script volume create "$VOL" \
            "$HOST:$ROOT/bricks/1" "$HOST:$ROOT/bricks/2" force >/dev/null ||
            cant "cannot create volume $VOL"
    fi
    local o
    for o in performance.stat-prefetch performance.quick-read performance.io-cache \
        performance.read-ahead performance.write-behind performance.open-behind \
        performance.readdir-ahead; do
        gluster --mode=script volume set "$VOL" "$o" off >/dev/null
    done
    gluster --mode=script volume set "$VOL" performance.md-cache-timeout 0 >/dev/null
    # Two cores shared by builds and tests: a brick can be slow to answer
    # for longer than the default 42 s without being gone.
    gluster --mode=script volume set "$VOL" network.ping-timeout 300 >/dev/null
    if ! gluster --mode=script volume status "$VOL" >/dev/null 2>&1; then
        gluster --mode=script volume start "$VOL" >/dev/null 9>&- || cant "cannot start volume $VOL"
    fi
}

# A mount that answers (its client can lose the bricks for good when the
# machine is overloaded past the ping timeout).
is_healthy() { is_mounted "$1" && timeout 20 stat -f "$1" >/dev/null 2>&1; }

ensure_mount() {
    is_healthy "$1" && return
    if is_mounted "$1"; then
        echo "gluster.sh: $1 does not answer; mounting it again" >&2
        umount -l "$1" || true
    fi
    mkdir -p "$1"
    # setsid: the client daemon must not be in the caller's process group
    # (a test harness that kills its group would kill the "host").
    setsid mount -t glusterfs -o "$MOUNT_OPTS" "$HOST:/$VOL" "$1" 9>&- || cant "cannot mount $HOST:/$VOL on $1"
    chmod 1777 "$1"
}

start() {
    [ "$(id -u)" -eq 0 ] || cant "needs root (glusterd, mount)"
    [ -e /dev/fuse ] || cant "/dev/fuse is missing"
    ensure_packages
    mkdir -p "$ROOT"
    exec 9>"$ROOT/.lock"
    flock 9
    if is_healthy "$A" && is_healthy "$B"; then
        echo "$A"
        echo "$B"
        return
    fi
    ensure_glusterd
    ensure_volume
    ensure_mount "$A"
    ensure_mount "$B"
    echo "$A"
    echo "$B"
}

stop() {
    mkdir -p "$ROOT"
    exec 9>"$ROOT/.lock"
    flock 9
    local m
    for m in "$A" "$B"; do
        is_mounted "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
    done
    if command -v gluster >/dev/null 2>&1 && gluster --mode=script volume info "$VOL" >/dev/null 2>&1; then
        gluster --mode=script volume stop "$VOL" force >/dev/null || true
        gluster --mode=script volume delete "$VOL" >/dev/null || true
    fi
    rm -rf "$ROOT/bricks"
    if [ -s "$ROOT/glusterd.pid" ]; then
        kill "$(cat "$ROOT/glusterd.pid")" 2>/dev/null || true
        rm -f "$ROOT/glusterd.pid"
    fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status)
    is_mounted "$A" && is_mounted "$B" || { echo "gluster.sh: not running" >&2; exit 1; }
    echo "$A"
    echo "$B"
    ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 64
    ;;
esac
