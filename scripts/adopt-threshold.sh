#!/usr/bin/env bash
# What an adoption costs a short-lived process under `mapfs run`, against
# leaving its file on the mount: 100 `dd bs=4k` processes reading and
# overwriting files of 16 KiB to 1 MiB, adopting at the first data call vs
# never, on a kernel-passthrough mount, a `--data daemon` one (writeback
# cache off) and a plfs mount (`--data auto`: adopted plfs files are lent,
# their data calls run in the shim's engine). Prints ms per process. Needs
# a release build. MAPFS_BIN overrides the mapfs binary.
# Usage: bash scripts/adopt-threshold.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MAPFS_BIN:-$PWD/target/release/mapfs}
W=${1:-/var/tmp/mapfs-adopt-threshold}
mkdir -p "$W/pt/b" "$W/pt/m" "$W/dm/b" "$W/dm/m" "$W/pl/b" "$W/pl/m"
"$M" mount passthrough "$W/pt/b" "$W/pt/m"
"$M" mount passthrough "$W/dm/b" "$W/dm/m" --data daemon --writeback-cache off
"$M" mount plfs "$W/pl/b" "$W/pl/m"
trap '"$M" umount "$W/pt/m"; "$M" umount "$W/dm/m"; "$M" umount "$W/pl/m"' EXIT
for kb in 16 64 256 1024; do
    head -c $((kb * 1024)) /dev/zero > "$W/zero$kb"
    for m in pt dm pl; do head -c $((kb * 1024)) /dev/urandom > "$W/$m/m/f$kb"; done
done
per_process() { # MOUNT THRESHOLD SCRIPT -> ms per process over 100 processes
    local s e
    s=$(date +%s.%N)
    MAPFS_PRELOAD_ADOPT_CALLS=$2 MAPFS_PRELOAD_ADOPT_BYTES=1000000000 "$M" run --mount "$1" -- sh -c "for i in \$(seq 100); do $3; done"
    e=$(date +%s.%N)
    python3 -c "print(round(($e - $s) * 10, 2))"
}
for m in pt dm pl; do for kb in 16 64 256 1024; do
    r="dd if=$W/$m/m/f$kb of=/dev/null bs=4k status=none"
    w="dd if=$W/zero$kb of=$W/$m/m/w$kb bs=4k conv=notrunc status=none"
    echo "$m read  ${kb}K: adopt at 1: $(per_process "$W/$m/m" 1 "$r") ms, never: $(per_process "$W/$m/m" 1000000000 "$r") ms"
    echo "$m write ${kb}K: adopt at 1: $(per_process "$W/$m/m" 1 "$w") ms, never: $(per_process "$W/$m/m" 1000000000 "$w") ms"
done; done
