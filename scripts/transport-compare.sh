#!/usr/bin/env bash
# FUSE over io_uring against /dev/fuse (docs/transport.md): a Python loop of
# N creates (open O_CREAT + close), stats and unlinks, files/s, on native
# BACKING and through two passthrough mounts of it side by side, one per
# transport, rounds interleaved so that the ratios compare runs made under
# the same load. Root (the daemon turns fuse.enable_uring on).
#
#   bash scripts/transport-compare.sh [BACKING_PARENT [ROUNDS [N]]]
#
# BACKING_PARENT defaults to /dev/shm (tmpfs); uses target/release/mapfs
# (or $MAPFS). Extra mount arguments: $MAPFS_MOUNT_ARGS (default
# --no-supervisor).
set -euo pipefail
cd "$(dirname "$0")/.."
parent=${1:-/dev/shm}
rounds=${2:-3}
n=${3:-3000}
target=${CARGO_TARGET_DIR:-target}
mapfs=${MAPFS:-$target/release/mapfs}
[ -x "$mapfs" ] || cargo build --release -p mapfs-cli --bin mapfs
work=$(mktemp -d "$parent/mapfs-transport.XXXXXX")
mnt=$(mktemp -d /tmp/mapfs-transport-mnt.XXXXXX)
loop=$(mktemp /tmp/mapfs-transport-loop.XXXXXX.py)
cleanup() {
    for t in dev uring; do
        "$mapfs" umount "$mnt/$t" 2>/dev/null || umount -l "$mnt/$t" 2>/dev/null || true
    done
    rm -rf "$work" "$mnt" "$loop"
}
trap cleanup EXIT
cat >"$loop" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
names = [os.path.join(d, f"f{i}") for i in range(n)]
t = time.perf_counter()
for p in names:
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
c = time.perf_counter()
for p in names:
    os.stat(p)
s = time.perf_counter()
for p in names:
    os.unlink(p)
u = time.perf_counter()
print(f"{n/(c-t):.0f} {n/(s-c):.0f} {n/(u-s):.0f}")
PY
mkdir -p "$work/native"
for t in dev uring; do
    mkdir -p "$work/$t" "$mnt/$t"
    # shellcheck disable=SC2086
    "$mapfs" mount passthrough "$work/$t" "$mnt/$t" -o "transport=$t" \
        ${MAPFS_MOUNT_ARGS---no-supervisor}
done
echo "backing: $parent ($(stat -f -c %T "$parent")); $n files; load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-7s %10s %10s %10s\n' round config create stat unlink
for r in $(seq "$rounds"); do
    declare -A res=()
    for c in native dev uring; do
        dir=$work/native
        [ "$c" = native ] || dir=$mnt/$c
        res[$c]=$(python3 "$loop" "$dir" "$n")
        # shellcheck disable=SC2086
        printf '%-6s %-7s %10s %10s %10s\n' "$r" "$c" ${res[$c]}
    done
    python3 - "${res[dev]}" "${res[uring]}" "$r" <<'PY'
import sys
d = [float(x) for x in sys.argv[1].split()]
u = [float(x) for x in sys.argv[2].split()]
print(f"{sys.argv[3]:<6} {'ratio':<7} " + " ".join(f"{b / a:>9.2f}x" for a, b in zip(d, u)))
PY
done
for t in dev uring; do
    "$mapfs" stats "$mnt/$t" | grep '^transport'
done
