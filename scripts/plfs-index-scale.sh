#!/usr/bin/env bash
# Open time and index memory of a plfs file written by W writers (W
# processes, each its own host id), on tmpfs, ext4 and GlusterFS (when
# scripts/gluster.sh can start it): the figures of docs/plfs-hosts.md.
#
#   scripts/plfs-index-scale.sh [W...]     # default: 4 64 1024
#
# GLUSTER_MAX_W (default 64) caps W on Gluster: with 1,024 writer processes
# 8 at a time (each taking the container's flock) the bricks of this
# one-machine volume stopped answering within minutes, twice. One at a time
# works (PLFS_SCALE_AT_ONCE=1, read by the example; 25 minutes for 1,024):
#   GLUSTER_MAX_W=1024 PLFS_SCALE_AT_ONCE=1 scripts/plfs-index-scale.sh 1024
# (see docs/plfs-hosts.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build -q --release -p mapfs-fs --example plfs_index_scale
bin=$CARGO_TARGET_DIR/release/examples/plfs_index_scale
ws=("$@")
[ ${#ws[@]} -gt 0 ] || ws=(4 64 1024)
backings=("tmpfs:/dev/shm" "ext4:/var/tmp")
if gl=$(bash scripts/gluster.sh start 2>/dev/null); then
    backings+=("gluster:$(echo "$gl" | head -1)")
else
    echo "plfs-index-scale: GlusterFS cannot run here; tmpfs and ext4 only" >&2
fi
for b in "${backings[@]}"; do
    name=${b%%:*}
    root=${b#*:}
    for w in "${ws[@]}"; do
        if [ "$name" = gluster ] && [ "$w" -gt "${GLUSTER_MAX_W:-64}" ]; then
            echo "backing=$name W=$w skipped (GLUSTER_MAX_W=${GLUSTER_MAX_W:-64})"
            continue
        fi
        d=$(mktemp -d "$root/plfs-index-scale.XXXXXX")
        echo "backing=$name $($bin "$d" "$w")"
        rm -rf "$d"
    done
done
