#!/usr/bin/env bash
# What the daemon's always-on counters (`mapfs stats`) cost: the same
# workloads on a `--data daemon` passthrough mount with the counters on and
# off (MAPFS_STATS=off), runs interleaved so that drift hits both alike.
#
#   bash scripts/stats-overhead.sh [BACKING_PARENT] [RUNS]
#
# BACKING_PARENT (default /dev/shm, tmpfs: isolates the FUSE cost) holds the
# backing directory; its file system type is printed with every figure.
# Workloads: create / stat / unlink of 5,000 empty files (one process,
# ops/s per phase), and 4 KiB random writes with fio (64 MiB file, 10 s,
# IOPS). Needs a release build (cargo build --release) and fio.
set -euo pipefail
cd "$(dirname "$0")/.."
MAPFS=${MAPFS:-target/release/mapfs}
PARENT=${1:-/dev/shm}
RUNS=${2:-3}
FILES=5000
FSTYPE=$(findmnt -T "$PARENT" -no FSTYPE)
work=$(mktemp -d "$PARENT/mapfs-ovh.XXXXXX")
mnt=$(mktemp -d /tmp/mapfs-ovh-mnt.XXXXXX)
trap '"$MAPFS" umount "$mnt" 2>/dev/null || true; rm -rf "$work" "$mnt"' EXIT

meta() { # DIR -> "create stat unlink" ops/s
    python3 - "$1" "$FILES" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
names = [os.path.join(d, "f%d" % i) for i in range(n)]
out = []
t = time.perf_counter()
for p in names:
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
out.append(n / (time.perf_counter() - t))
t = time.perf_counter()
for p in names:
    os.stat(p)
out.append(n / (time.perf_counter() - t))
t = time.perf_counter()
for p in names:
    os.unlink(p)
out.append(n / (time.perf_counter() - t))
print(" ".join("%.0f" % x for x in out))
PY
}

randwrite() { # DIR -> IOPS
    fio --name=rw --directory="$1" --rw=randwrite --bs=4k --size=64m \
        --runtime=10 --time_based --ioengine=psync --output-format=terse \
        --terse-version=3 2>/dev/null | awk -F';' '{print $49}'
}

run() { # on|off -> "create stat unlink iops"
    rm -rf "$work/b"; mkdir "$work/b"
    if [ "$1" = off ]; then
        MAPFS_STATS=off "$MAPFS" mount passthrough "$work/b" "$mnt" --data daemon
    else
        "$MAPFS" mount passthrough "$work/b" "$mnt" --data daemon
    fi
    local m; m=$(meta "$mnt")
    local w; w=$(randwrite "$mnt")
    "$MAPFS" umount "$mnt"
    echo "$m $w"
}

echo "backing: $PARENT ($FSTYPE); $FILES files; runs: $RUNS each, interleaved"
echo "counters create/s stat/s unlink/s randwrite-4k-IOPS"
for r in $(seq "$RUNS"); do
    for mode in on off; do
        echo "$mode $(run $mode)"
    done
done
