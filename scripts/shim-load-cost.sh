#!/usr/bin/env bash
# What loading the preload shim costs one short-lived process, beside no
# preload and an empty C library preloaded (the dynamic loader's price for
# any library): /bin/true, `cat` of an 8 KiB file of a `--data auto`
# passthrough mount, and a `sh` loop of `cat`s (the shell under the shim
# too), CPU time and page faults per process, medians of ROUNDS alternating
# rounds (scripts/shim-load-cost/spawn.c). OLD_SHIM=path adds another build
# of the shim. Needs a release build and cc.
# Usage: bash scripts/shim-load-cost.sh [ROUNDS] [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MAPFS_BIN:-$PWD/target/release/mapfs}
SHIM=$(dirname "$M")/libmapfs_preload.so
R=${1:-9}
W=${2:-/var/tmp/mapfs-shim-load-cost}
mkdir -p "$W/b" "$W/m"
cc -O2 -o "$W/spawn" scripts/shim-load-cost/spawn.c
echo 'void mapfs_shim_load_cost_empty(void) {}' >"$W/empty.c"
cc -O2 -shared -fPIC -o "$W/libempty.so" "$W/empty.c"
"$M" mount passthrough "$W/b" "$W/m" --data auto
trap '"$M" umount "$W/m"' EXIT
head -c 8192 /dev/urandom >"$W/m/small"
# As `mapfs run` sets them: the mount and its device number.
export MAPFS_MOUNTS="$W/m" MAPFS_MOUNT_DEVS
MAPFS_MOUNT_DEVS=$(stat -c %d "$W/m")
SB_CONFIGS="none=,empty-lib=$W/libempty.so${OLD_SHIM:+,old-shim=$OLD_SHIM},shim=$SHIM"
export SB_CONFIGS
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== /bin/true"
"$W/spawn" "$R" 300 /bin/true
echo "== cat of an 8 KiB mount file"
"$W/spawn" "$R" 300 cat "$W/m/small"
echo "== sh loop of 300 cats (per cat; the shell under the same preload)"
"$W/spawn" "$R" 1 sh -c 'i=0; while [ $i -lt 300 ]; do cat "$1" >/dev/null || exit 1; i=$((i+1)); done' sh "$W/m/small" |
    awk 'NR == 1 { print; next } { printf "%-10s %9.1f %9.1f %7.1f\n", $1, $2 / 300, $3 / 300, $4 / 300 }'
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
