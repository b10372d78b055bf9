#!/usr/bin/env bash
# Many small files: native, the passthrough mount and the pack mount side
# by side, on tmpfs and on the disk's file system, in one run.
#
#   bash scripts/bench-small-files.sh [FILES] [SIZES] [RUNS]
#
# FILES (default 20000) files of each size in SIZES (default "4096 1024")
# are created in directories of 1,000 (open O_CREAT, one write, close), the
# page cache is dropped, then every file is read back (open, read, close)
# and checked. Figures: files/s per phase (median of RUNS, default 3),
# then the backing directory's disk usage (`du -sk`) and entry count
# (`find | wc -l`), with the ratio to native. The backing file system is
# named in every line: tmpfs is a fresh tmpfs mount, ext4 (or whatever
# /var/tmp is) a directory in /var/tmp. Needs root (tmpfs mount, drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-20000}
SIZES=${2:-"4096 1024"}
RUNS=${3:-3}
BIN=${MAPFS:-target/release/mapfs}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p mapfs-cli" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "run as root (tmpfs mount, drop_caches)" >&2; exit 1; }

tmpfs=$(mktemp -d /tmp/mapfs-sf-tmpfs.XXXXXX)
mount -t tmpfs -o size=4g tmpfs "$tmpfs"
disk=$(mktemp -d /var/tmp/mapfs-sf.XXXXXX)
mnt=$(mktemp -d /tmp/mapfs-sf-mnt.XXXXXX)
cleanup() {
    "$BIN" umount "$mnt" 2>/dev/null || true
    umount "$tmpfs" 2>/dev/null || true
    rm -rf "$tmpfs" "$disk" "$mnt"
}
trap cleanup EXIT

phase() { # MODE DIR SIZE -> files/s
    python3 - "$1" "$2" "$FILES" "$3" <<'PY'
import os, sys, time
mode, d, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def name(i): return os.path.join(d, "d%d" % (i // 1000), "f%d" % i)
def body(i): return (b"%08d" % i) * (size // 8) + b"x" * (size % 8)
t = time.perf_counter()
if mode == "create":
    for i in range(0, n, 1000):
        os.mkdir(os.path.join(d, "d%d" % (i // 1000)))
    for i in range(n):
        fd = os.open(name(i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, body(i))
        os.close(fd)
else:
    for i in range(n):
        fd = os.open(name(i), os.O_RDONLY)
        b = os.read(fd, size + 1)
        os.close(fd)
        if b != body(i):
            sys.exit("bytes of %s differ" % name(i))
print("%.0f" % (n / (time.perf_counter() - t)))
PY
}

median() { tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf '%-6s %-6s %-12s %10s %10s %10s %9s %10s %9s\n' \
    backing size config create/s read/s du_KiB du/native entries ent/native
for where in tmpfs disk; do
    parent=$tmpfs; [ "$where" = disk ] && parent=$disk
    fstype=$(findmnt -n -o FSTYPE -T "$parent")
    for size in $SIZES; do
        declare -A du_of=() ent_of=()
        for config in native passthrough pack; do
            creates=() reads=()
            for run in $(seq "$RUNS"); do
                b="$parent/b-$config-$size-$run"
                mkdir "$b"
                dir=$b
                if [ "$config" != native ]; then
                    "$BIN" mount "$config" "$b" "$mnt" >/dev/null
                    dir=$mnt
                fi
                creates+=("$(phase create "$dir" "$size")")
                sync
                echo 3 >/proc/sys/vm/drop_caches
                reads+=("$(phase read "$dir" "$size")")
                [ "$config" != native ] && "$BIN" umount "$mnt" >/dev/null
                sync
                du_of[$config]=$(du -sk "$b" | cut -f1)
                ent_of[$config]=$(find "$b" | wc -l)
                rm -rf "$b"
            done
            c=$(echo "${creates[@]}" | median)
            r=$(echo "${reads[@]}" | median)
            printf '%-6s %-6s %-12s %10s %10s %10s %9.2f %10s %9.4f\n' \
                "$fstype" "$size" "$config" "$c" "$r" "${du_of[$config]}" \
                "$(awk "BEGIN {print ${du_of[$config]} / ${du_of[native]}}")" \
                "${ent_of[$config]}" "$(awk "BEGIN {print ${ent_of[$config]} / ${ent_of[native]}}")"
        done
        unset du_of ent_of
    done
done
