#!/usr/bin/env bash
# What the preload shim costs whole jobs of short-lived processes: CPU time
# (perf's task-clock over every process of the job; the daemon's own time
# is not included) and wall time of a shell loop of 300 `cat`s of an 8 KiB
# file and of `make -j2` of a 41-file C project, on a `--data auto`
# passthrough mount and a plfs mount, with and without the shim, and
# natively; medians of ROUNDS alternating rounds. OLD_SHIM=path adds a row
# for another build of the shim (e.g. an earlier commit's). Needs a release
# build, perf, make and cc.
# Usage: bash scripts/shim-cost.sh [ROUNDS] [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MAPFS_BIN:-$PWD/target/release/mapfs}
SHIM=$(dirname "$M")/libmapfs_preload.so
R=${1:-7}
W=${2:-/var/tmp/mapfs-shim-cost}
mkdir -p "$W/b" "$W/m" "$W/pb" "$W/pm"
"$M" mount passthrough "$W/b" "$W/m" --data auto
"$M" mount plfs "$W/pb" "$W/pm"
trap '"$M" umount "$W/m"; "$M" umount "$W/pm"' EXIT
head -c 8192 /dev/urandom > "$W/m/small"
cp "$W/m/small" "$W/pm/small"
mkdir -p "$W/native" && cp "$W/m/small" "$W/native/small"
dev=$(stat -c %d "$W/m")
pdev=$(stat -c %d "$W/pm")
loop='i=0; while [ $i -lt 300 ]; do cat "$1" >/dev/null || exit 1; i=$((i+1)); done'

project() { # DIR: the bench's `build` project, from scratch
    rm -rf "$1" && mkdir -p "$1"
    local objs="" i
    for i in $(seq 0 39); do
        printf 'long u%d(long x);\n' "$i" >"$1/u$i.h"
        printf '#include "u%d.h"\nlong u%d(long x) { long s = 0; for (long k = 0; k < x; k++) s += (k ^ %d) %% 7; return s; }\n' "$i" "$i" "$i" >"$1/u$i.c"
        objs="$objs u$i.o"
    done
    {
        echo '#include <stdio.h>'
        for i in $(seq 0 39); do echo "#include \"u$i.h\""; done
        echo 'int main(void) { long t = 0;'
        for i in $(seq 0 39); do echo "t += u$i($((100 + i)));"; done
        echo 'printf("%ld\n", t); return 0; }'
    } >"$1/main.c"
    printf 'CFLAGS = -O1\nprog:%s main.o\n\t$(CC) -o $@ $^\n%%.o: %%.c\n\t$(CC) $(CFLAGS) -c -o $@ $<\n' "$objs" >"$1/Makefile"
}

measure() { # NAME KIND(spawn|build) DIR ENV...
    local name=$1 kind=$2 dir=$3
    shift 3
    local cmd
    if [ "$kind" = spawn ]; then
        cmd=(sh -c "$loop" sh "$dir/small")
    else
        project "$dir/proj"
        cmd=(make -s -j2 -C "$dir/proj")
    fi
    local s e cpu
    s=$(date +%s%N)
    cpu=$(env "$@" perf stat -x, -e task-clock "${cmd[@]}" 2>&1 >/dev/null | grep task-clock | cut -d, -f1)
    e=$(date +%s%N)
    echo "$kind $name ${cpu%.*} $(((e - s) / 1000000))"
}

out=$(mktemp)
for _ in $(seq "$R"); do
    for kind in spawn build; do
        measure native "$kind" "$W/native" LD_PRELOAD= >>"$out"
        measure auto "$kind" "$W/m" LD_PRELOAD= >>"$out"
        if [ -n "${OLD_SHIM:-}" ]; then
            measure auto+old-shim "$kind" "$W/m" LD_PRELOAD="$OLD_SHIM" MAPFS_MOUNTS="$W/m" >>"$out"
        fi
        measure auto+shim "$kind" "$W/m" LD_PRELOAD="$SHIM" MAPFS_MOUNTS="$W/m" MAPFS_MOUNT_DEVS="$dev" >>"$out"
        measure plfs "$kind" "$W/pm" LD_PRELOAD= >>"$out"
        measure plfs+shim "$kind" "$W/pm" LD_PRELOAD="$SHIM" MAPFS_MOUNTS="$W/pm" MAPFS_MOUNT_DEVS="$pdev" >>"$out"
    done
done
echo "workload config cpu_ms wall_ms (medians of $R rounds)"
python3 - "$out" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    kind, name, cpu, wall = line.split()
    rows.setdefault((kind, name), []).append((int(cpu), int(wall)))
for (kind, name), v in rows.items():
    print(kind, name, int(statistics.median(c for c, _ in v)), int(statistics.median(w for _, w in v)))
PY
rm -f "$out"
