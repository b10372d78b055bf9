#!/usr/bin/env bash
# What the supervisor costs on the data path: the same fio jobs through a
# supervised mount and a --no-supervisor mount of the same build, runs
# interleaved, medians printed (MiB/s). Daemon-run data paths only (kernel
# passthrough never reaches the daemon): passthrough --data daemon, and
# plfs, whose maps a supervised daemon hands to the file system at every
# change (docs/failover.md).
#
#   bash scripts/failover-overhead.sh [BACKING_PARENT] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
PARENT=${1:-/var/tmp}
RUNS=${2:-3}
BIN=${BIN:-target/release/mapfs}
FSTYPE=$(stat -f -c %T "$PARENT")
work=$(mktemp -d "$PARENT/mapfs-fo.XXXXXX")
mnt=$(mktemp -d /tmp/mapfs-fo-mnt.XXXXXX)
mounted=
trap '[ -n "$mounted" ] && "$BIN" umount "$mnt" 2>/dev/null; rm -rf "$work" "$mnt"' EXIT
job() { # NAME ARGS... -> MiB/s
    fio --name="$1" --directory="$mnt" --output-format=json "${@:2}" \
        | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["write"]; print("%.1f" % (j["bw_bytes"]/2**20))'
}
results=$(mktemp)
echo "backing: $PARENT ($FSTYPE); $RUNS runs, interleaved; MiB/s"
for r in $(seq "$RUNS"); do
    for fs in "passthrough --data daemon" "plfs"; do
        for sup in supervised unsupervised; do
            extra=(); [ "$sup" = unsupervised ] && extra=(--no-supervisor)
            rm -rf "$work/b"; mkdir "$work/b"
            # shellcheck disable=SC2086
            "$BIN" mount $fs "$work/b" "$mnt" "${extra[@]}"; mounted=1
            seq=$(job seq --rw=write --bs=1M --size=256M --end_fsync=1)
            rnd=$(job rnd --rw=randwrite --bs=4k --size=32M --runtime=8 --time_based)
            "$BIN" umount "$mnt"; mounted=
            name="${fs%% *}-$sup"
            echo "$name $seq $rnd" | tee -a "$results"
        done
    done
done
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
names = list(dict.fromkeys(r[0] for r in rows))
print("median            seq-write-1M  randwrite-4k")
for n in names:
    v = [statistics.median(float(r[i]) for r in rows if r[0] == n) for i in (1, 2)]
    print("%-18s %10.1f %12.1f" % (n, v[0], v[1]))
PY
rm -f "$results"
