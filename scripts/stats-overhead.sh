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
# ops/s per phase), and 4 KiB random writes with fio (64 MiB file, 5 s,
# IOPS); the medians of each are printed last. Needs a release build (cargo build --release) and fio.
set -euo pipefail
cd "$(dirname "$0")/.."
MAPFS=${MAPFS:-target/release/mapfs}
PARENT=${1:-/dev/shm}
RUNS=${2:-3}
FILES=5000
FSTYPE=$(stat -f -c %T "$PARENT")
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
        --runtime=5 --time_based --ioengine=psync --output-format=terse \
        --terse-version=3 2>/dev/null | awk -F';' '{print $49}'
}

cpu_ns() { # PID -> ns its threads ran on a CPU so far
    cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {printf "%d", s}'
}

run() { # on|off -> "create stat unlink iops meta-cpu-us/op write-cpu-us/io"
    rm -rf "$work/b"; mkdir "$work/b"
    if [ "$1" = off ]; then
        MAPFS_STATS=off "$MAPFS" mount passthrough "$work/b" "$mnt" --data daemon
    else
        "$MAPFS" mount passthrough "$work/b" "$mnt" --data daemon
    fi
    local pid; pid=$("$MAPFS" list --json "$mnt" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["daemon_pid"])')
    local c0; c0=$(cpu_ns "$pid")
    local m; m=$(meta "$mnt")
    local c1; c1=$(cpu_ns "$pid")
    local w; w=$(randwrite "$mnt")
    local c2; c2=$(cpu_ns "$pid")
    "$MAPFS" umount "$mnt"
    # Daemon CPU time per application metadata call (3 per file) and per
    # write (IOPS x 5 s).
    echo "$m $w $(python3 -c "print('%.2f %.2f' % (($c1-$c0)/1e3/(3*$FILES), ($c2-$c1)/1e3/max(1, $w*5)))")"
}

echo "backing: $PARENT ($FSTYPE); $FILES files; runs: $RUNS each, interleaved"
echo "counters create/s stat/s unlink/s randwrite-4k-IOPS daemon-cpu-us/meta-op daemon-cpu-us/write"
results=$(mktemp)
for r in $(seq "$RUNS"); do
    for mode in on off; do
        line="$mode $(run $mode)"
        echo "$line" | tee -a "$results"
    done
done
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = {m: [statistics.median(float(r[i]) for r in rows if r[0] == m) for i in range(1, 7)]
       for m in ("on", "off")}
print("median  create/s stat/s unlink/s randwrite-4k-IOPS daemon-cpu-us/meta-op daemon-cpu-us/write")
for m in ("on", "off"):
    print("%-7s %s" % (m, " ".join("%.0f" % x for x in med[m][:4]) + " %.2f %.2f" % tuple(med[m][4:])))
print("on/off  %s" % " ".join("%.3f" % (a / b) for a, b in zip(med["on"], med["off"])))
PY
rm -f "$results"
