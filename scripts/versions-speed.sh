#!/usr/bin/env bash
# The `versions` file system's write cost, in one run against passthrough
# and native on the same backing: the `overwrite` workload (FILES files of
# 2 KiB-1 MiB, log-uniform, rewritten ROUNDS times: whole rewrites with
# O_TRUNC, and 4 KiB patches in place), and fio 4k random writes to a
# 256 MiB file opened once. Throughput includes a final syncfs, so copies
# made for versions are paid for. Prints a Markdown table per backing with
# the bytes the versions keep (`mapfs versions stats`). Backings: ext4 (or
# whatever WORKDIR is on), tmpfs, and an xfs image on a loop device (root).
# Needs a release build (`cargo build --release -p mapfs-cli`), fio, python3.
# Usage: bash scripts/versions-speed.sh [WORKDIR] [REPEATS] [FILES] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
M=$PWD/target/release/mapfs
W=${1:-/var/tmp/mapfs-versions-speed}
REPEATS=${2:-3}
FILES=${3:-1000}
ROUNDS=${4:-10}
mkdir -p "$W"
W=$(cd "$W" && pwd)
MOUNTED=()
cleanup() {
    for m in "${MOUNTED[@]}"; do "$M" umount "$m" 2>/dev/null || umount "$m" 2>/dev/null || true; done
    [ -n "${LOOPIMG:-}" ] && rm -f "$LOOPIMG"
    return 0
}
trap cleanup EXIT

# overwrite DIR MODE: prints MB/s (MODE rewrite: O_TRUNC whole files;
# patch: 4 KiB written in place in each file).
WORKER='
import os, sys, random, time, ctypes
syncfs = ctypes.CDLL(None, use_errno=True).syncfs
d, mode, files, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(42)
sizes = [int(2048 * (512 ** rng.random())) for _ in range(files)]
buf = os.urandom(1 << 20)
if not os.path.exists(os.path.join(d, "f0")):
    for i, s in enumerate(sizes):
        with open(os.path.join(d, f"f{i}"), "wb") as f: f.write(buf[:s])
    fd = os.open(d, os.O_RDONLY); syncfs(fd); os.close(fd)
if mode == "prepare": sys.exit(0)
t = time.perf_counter(); total = 0
for r in range(rounds):
    for i, s in enumerate(sizes):
        p = os.path.join(d, f"f{i}")
        if mode == "rewrite":
            fd = os.open(p, os.O_WRONLY | os.O_TRUNC); os.write(fd, buf[r:r + s]); total += s
        else:
            fd = os.open(p, os.O_WRONLY); off = (s // 2) & ~4095
            os.pwrite(fd, buf[r:r + 4096], off); total += 4096
        os.close(fd)
fd = os.open(d, os.O_RDONLY); syncfs(fd); os.close(fd)
print(total / (time.perf_counter() - t) / 1e6)
'
med() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
randw() { # FILE -> MB/s of 4k random writes, one open, 5 s, then fsync
    fio --name=t --filename="$1" --rw=randwrite --bs=4k --size=256M --time_based --runtime=5 \
        --ioengine=psync --end_fsync=1 --invalidate=0 --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(j["write"]["bw_bytes"]/1e6)'
}

# measure BACKING_ROOT NAME
measure() {
    local root=$1 name=$2
    declare -A R P F
    local kept=""
    for cfg in native passthrough versions; do
        R[$cfg]=""; P[$cfg]=""; F[$cfg]=""
    done
    for rep in $(seq "$REPEATS"); do
        for cfg in native passthrough versions; do
            local b=$root/$cfg-$rep mnt=$root/mnt-$cfg-$rep dir
            rm -rf "$b" "$mnt"; mkdir -p "$b" "$mnt"
            python3 -c "$WORKER" "$b" prepare "$FILES" "$ROUNDS"
            fio --name=p --filename="$b/big" --size=256M --rw=write --bs=1M --output=/dev/null
            dir=$b
            if [ "$cfg" != native ]; then
                "$M" mount "$cfg" "$b" "$mnt" --data auto
                MOUNTED+=("$mnt"); dir=$mnt
            fi
            R[$cfg]+=" $(python3 -c "$WORKER" "$dir" rewrite "$FILES" "$ROUNDS")"
            P[$cfg]+=" $(python3 -c "$WORKER" "$dir" patch "$FILES" "$ROUNDS")"
            F[$cfg]+=" $(randw "$dir/big")"
            if [ "$cfg" = versions ] && [ "$rep" = 1 ]; then
                kept=$("$M" versions stats "$b" | sed -n 's/^\(versions\|bytes kept\|allocated\): *//p' | tr '\n' ';')
            fi
            if [ "$cfg" != native ]; then "$M" umount "$mnt"; fi
            rm -rf "$b" "$mnt"
        done
    done
    echo
    echo "### $name ($FILES files, $ROUNDS rounds, median of $REPEATS)"
    echo
    echo "| workload | native MB/s | passthrough MB/s | versions MB/s | versions / passthrough |"
    echo "|---|---|---|---|---|"
    for w in R:overwrite-rewrite P:overwrite-patch-4k F:randwrite-4k-256M; do
        local k=${w%%:*} label=${w#*:} n p v
        eval "n=\$(med \${$k[native]}); p=\$(med \${$k[passthrough]}); v=\$(med \${$k[versions]})"
        python3 -c "print(f'| $label | {$n:.0f} | {$p:.0f} | {$v:.0f} | {$v/$p:.2f}x |')"
    done
    echo
    echo "versions kept after one run (versions; bytes kept; allocated): $kept"
}

measure "$W" "$(findmnt -n -o FSTYPE -T "$W") ($W)"
T=$W/tmpfs; mkdir -p "$T"
if mount -t tmpfs -o size=8g tmpfs "$T" 2>/dev/null; then
    MOUNTED+=("$T"); measure "$T" "tmpfs"
else
    echo "SKIPPED tmpfs: cannot mount one (not root?)" >&2
fi
X=$W/xfs; mkdir -p "$X"; LOOPIMG=$W/xfs.img
if command -v mkfs.xfs >/dev/null && truncate -s 12g "$LOOPIMG" && mkfs.xfs -q "$LOOPIMG" &&
    mount -o loop "$LOOPIMG" "$X" 2>/dev/null; then
    MOUNTED+=("$X"); measure "$X" "xfs on a loop device (image on $(findmnt -n -o FSTYPE -T "$W"))"
else
    echo "SKIPPED xfs: no mkfs.xfs or loop devices" >&2
fi
