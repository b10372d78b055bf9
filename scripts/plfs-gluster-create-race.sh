#!/usr/bin/env bash
# Checks that hosts creating one plfs file at once lose nothing:
# the fio N-1 pattern of scripts/plfs-gluster-bench.sh, 4 writers over two
# Gluster "hosts" (ranks 0 and 2 through host A, 1 and 3 through host B),
# repeated ROUNDS times on a fresh file. Every writer creates the file when
# it starts (`create_on_open`: four `open(O_CREAT)`s on two hosts at once)
# and writes its strided blocks, each rank its own byte; then, read through
# host B, the size must be the end of the last block and every block must
# hold its writer's bytes.
#
#   scripts/plfs-gluster-create-race.sh [ROUNDS] [BS]   # default 40, 65536
#   PLFS_RACE_LAYOUT=1 scripts/plfs-gluster-create-race.sh ...
#   PLFS_RACE_RUN=1 scripts/plfs-gluster-create-race.sh ...
#
# PLFS_RACE_RUN=1 runs each host's fio under `mapfs run --mount` (the
# preload shim writes the logs) instead of through the plfs mount.
#
# PLFS_RACE_LAYOUT=1 lets fio lay the file out as it does by default: each
# job whose file is shorter than its region removes the file and creates
# it again at its length (`open(O_CREAT)`, `fallocate`), so the two fio
# processes remove and create the file under each other; only a failed
# writer counts then (an `open(O_CREAT)` answered ENOENT), since
# one fio process can remove the other's longer layout (directly on
# Gluster, with no plfs, 7 of 40 rounds ended shorter than the furthest
# layout).
#
# Prints one line per round that went wrong and a summary; exits 1 if any
# did. Before creators took turns (container::Claim), about 1 round in 8-40
# lost a writer's extension (its container was replaced by another host's).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
rounds=${1:-40}
bs=${2:-65536}
io_mib=${PLFS_RACE_MIB:-8}
cargo build -q --release -p mapfs-cli
mapfs=$CARGO_TARGET_DIR/release/mapfs
gl=$(bash scripts/gluster.sh start) || { echo "plfs-gluster-create-race: GlusterFS cannot run here" >&2; exit 2; }
ga=$(echo "$gl" | sed -n 1p)
gb=$(echo "$gl" | sed -n 2p)
run=race-$$
mkdir -p "$ga/$run/plfs"
ma=$(mktemp -d /tmp/plfs-race-a.XXXXXX)
mb=$(mktemp -d /tmp/plfs-race-b.XXXXXX)
cleanup() {
    "$mapfs" umount "$ma" 2>/dev/null || true
    "$mapfs" umount "$mb" 2>/dev/null || true
    rmdir "$ma" "$mb" 2>/dev/null || true
    rm -rf "${ga:?}/$run"
}
trap cleanup EXIT
"$mapfs" mount plfs "$ga/$run/plfs" "$ma" --data auto --ttl 0 -o hostid=a
"$mapfs" mount plfs "$gb/$run/plfs" "$mb" --data auto --ttl 0 -o hostid=b
io=$((io_mib << 20))
# Rank R writes byte 0x41+R ('A'..'D') at R*BS, then every 4*BS.
job() {
    echo "--name=r$1 --filename=$2 --rw=write:$((3 * bs)) --offset=$(($1 * bs))" \
        "--size=$((4 * io)) --io_size=$io --buffer_pattern=0x$(printf %x $((0x41 + $1)))"
}
layout=${PLFS_RACE_LAYOUT:-0}
common="--ioengine=psync --bs=$bs --end_fsync=1 --output=/dev/null"
[ "$layout" = 1 ] || common="$common --create_on_open=1"
want=$((4 * io))
check() {
    python3 - "$1" "$bs" "$want" <<'PY'
import os, sys
path, bs, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# The size a stat sees first (a getattr merges on its own), then the bytes.
st = os.stat(path).st_size
if st != want:
    print(f"stat size {st}, want {want}")
with open(path, "rb") as f:
    data = f.read()
if len(data) != want:
    print(f"size {len(data)}, want {want}")
    sys.exit(1)
bad = [k for k in range(want // bs) if data[k * bs:(k + 1) * bs] != bytes([0x41 + k % 4]) * bs]
if bad:
    print(f"{len(bad)} blocks without their writer's bytes, first at {bad[0] * bs}")
    sys.exit(1)
if st != want:
    sys.exit(1)
PY
}
runner() {
    [ "${PLFS_RACE_RUN:-0}" = 1 ] && echo "$mapfs run --mount $1 --"
    true
}
bad=0
for i in $(seq "$rounds"); do
    # shellcheck disable=SC2046
    $(runner "$ma") fio $common $(job 0 "$ma/ckpt") $(job 2 "$ma/ckpt") &
    pa=$!
    # shellcheck disable=SC2046
    $(runner "$mb") fio $common $(job 1 "$mb/ckpt") $(job 3 "$mb/ckpt") &
    pb=$!
    ok=1
    wait "$pa" || ok=0
    wait "$pb" || ok=0
    res=
    if [ $ok = 0 ] || { [ "$layout" != 1 ] && ! res=$(check "$mb/ckpt" 2>&1); }; then
        echo "round $i: both fio processes succeeded: $ok; $res"
        bad=$((bad + 1))
    fi
    rm -rf "${ma:?}"/ckpt*
done
echo "plfs-gluster-create-race: $bad of $rounds rounds went wrong (bs $bs, layout by fio $layout, under mapfs run ${PLFS_RACE_RUN:-0}, backing GlusterFS)"
[ $bad = 0 ]
