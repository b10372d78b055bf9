#!/usr/bin/env bash
# Requests per call and files/s of a Python create/stat/list/unlink loop
# through a passthrough mount, for comparing builds (docs/metadata.md,
# "Round trips and locks").
#
#   bash scripts/metadata-roundtrips.sh MAPFS_BINARY BACKING_PARENT FILES [MOUNT ARGS...]
#
# Mounts BACKING_PARENT/rt-backing on a fresh mountpoint, runs the loop
# once (FILES names in one directory: open(p, "w") + close, os.stat,
# os.scandir + stat of every entry, os.unlink), prints files/s per phase
# and the mount's `mapfs stats`, and unmounts.
set -euo pipefail
bin=$1 parent=$2 files=$3
shift 3
backing=$parent/rt-backing
mnt=$(mktemp -d /tmp/rt-mnt.XXXXXX)
mkdir -p "$backing"
"$bin" mount passthrough "$backing" "$mnt" "$@" >/dev/null
trap '"$bin" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt"; rmdir "$mnt"' EXIT
"$bin" stats "$mnt" --reset >/dev/null
python3 - "$mnt/d" "$files" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
names = [os.path.join(d, "f%05d" % i) for i in range(n)]
r = {}
t = time.perf_counter()
for p in names:
    with open(p, "w"):
        pass
r["create"] = n / (time.perf_counter() - t)
t = time.perf_counter()
for p in names:
    os.stat(p)
r["stat"] = n / (time.perf_counter() - t)
t = time.perf_counter()
k = sum(1 for e in os.scandir(d) if e.stat(follow_symlinks=False))
assert k == n, (k, n)
r["ls-stat"] = n / (time.perf_counter() - t)
t = time.perf_counter()
for p in names:
    os.unlink(p)
r["unlink"] = n / (time.perf_counter() - t)
print(" ".join("%s=%.0f" % kv for kv in r.items()))
PY
"$bin" stats "$mnt"
rmdir "$mnt/d"
