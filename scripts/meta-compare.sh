#!/usr/bin/env bash
# Metadata calls through a mount against native, for comparing two builds
# of mapfs (before/after a change), runs interleaved, medians printed.
#
#   BINS="before:/tmp/mapfs-old after:target/release/mapfs" \
#     bash scripts/meta-compare.sh [BACKING_PARENT] [RUNS] [DATA]
#
# A spec may end in ":ARGS" (comma-separated) for `mount`, e.g.
# "unsupervised:target/release/mapfs:--no-supervisor".
#
# BACKING_PARENT (default /dev/shm) holds the backing and native
# directories; its file system type is printed with every figure. DATA is
# the --data mode (default auto). Per run, in one process: create 5,000
# empty files, stat each, stat 5,000 missing names twice (what a PATH or
# include-path search does), unlink each; ops/s per phase.
set -euo pipefail
cd "$(dirname "$0")/.."
PARENT=${1:-/dev/shm}
RUNS=${2:-3}
DATA=${3:-auto}
BINS=${BINS:-"current:target/release/mapfs"}
FILES=5000
FSTYPE=$(stat -f -c %T "$PARENT")
work=$(mktemp -d "$PARENT/mapfs-meta.XXXXXX")
mnt=$(mktemp -d /tmp/mapfs-meta-mnt.XXXXXX)
cur_bin=
trap '[ -n "$cur_bin" ] && "$cur_bin" umount "$mnt" 2>/dev/null; rm -rf "$work" "$mnt"' EXIT

meta() { # DIR -> "create stat stat-missing unlink" ops/s
    python3 - "$1" "$FILES" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
names = [os.path.join(d, "f%d" % i) for i in range(n)]
missing = [os.path.join(d, "m%d" % i) for i in range(n)]
out = []
def phase(f, items, reps=1):
    t = time.perf_counter()
    for _ in range(reps):
        for p in items:
            f(p)
    out.append(reps * len(items) / (time.perf_counter() - t))
def missing_stat(p):
    try:
        os.stat(p)
    except FileNotFoundError:
        pass
phase(lambda p: os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)), names)
phase(os.stat, names)
phase(missing_stat, missing, 2)
phase(os.unlink, names)
print(" ".join("%.0f" % x for x in out))
PY
}

results=$(mktemp)
echo "backing: $PARENT ($FSTYPE); --data $DATA; $FILES files; $RUNS runs, interleaved"
echo "config create/s stat/s stat-missing/s unlink/s"
for r in $(seq "$RUNS"); do
    rm -rf "$work/native"; mkdir "$work/native"
    echo "native $(meta "$work/native")" | tee -a "$results"
    for spec in $BINS; do
        name=${spec%%:*}; rest=${spec#*:}; cur_bin=${rest%%:*}; extra=()
        [ "$rest" != "$cur_bin" ] && IFS=, read -r -a extra <<< "${rest#*:}"
        rm -rf "$work/b"; mkdir "$work/b"
        "$cur_bin" mount passthrough "$work/b" "$mnt" --data "$DATA" "${extra[@]}"
        echo "$name $(meta "$mnt")" | tee -a "$results"
        "$cur_bin" umount "$mnt"; cur_bin=
    done
done
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
names = list(dict.fromkeys(r[0] for r in rows))
med = {m: [statistics.median(float(r[i]) for r in rows if r[0] == m) for i in range(1, 5)] for m in names}
print("median (x native)   create/s       stat/s         stat-missing/s unlink/s")
for m in names:
    print("%-18s %s" % (m, " ".join("%7.0f (%.2f)" % (v, v / n) for v, n in zip(med[m], med["native"]))))
PY
rm -f "$results"
