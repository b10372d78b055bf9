#!/usr/bin/env bash
# Checks that hosts creating one plfs file at once lose nothing (issue 14):
# the fio N-1 pattern of scripts/plfs-gluster-bench.sh, 4 writers over two
# Gluster "hosts" (ranks 0 and 2 through host A, 1 and 3 through host B),
# repeated ROUNDS times on a fresh file. fio first creates the file and
# extends it to the end of each writer's region (`fallocate`), then writes;
# each round's size, seen from host B, must be the furthest extension.
#
#   scripts/plfs-gluster-create-race.sh [ROUNDS] [BS]   # default 40, 65536
#
# Prints one line per round that went wrong and a summary; exits 1 if any
# did. Before creators took turns (container::Claim), about 1 round in 8-40
# lost a writer's extension (its container was replaced by another host's).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
rounds=${1:-40}
bs=${2:-65536}
io_mib=8
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
job() { echo "--name=r$1 --filename=$2 --rw=write:$((3 * bs)) --offset=$(($1 * bs)) --size=$((4 * io)) --io_size=$io"; }
common="--ioengine=psync --bs=$bs --end_fsync=1 --output=/dev/null"
want=$((3 * bs + 4 * io))
bad=0
for i in $(seq "$rounds"); do
    # shellcheck disable=SC2046
    fio $common $(job 0 "$ma/ckpt") $(job 2 "$ma/ckpt") &
    pa=$!
    # shellcheck disable=SC2046
    fio $common $(job 1 "$mb/ckpt") $(job 3 "$mb/ckpt") &
    pb=$!
    ok=1
    wait "$pa" || ok=0
    wait "$pb" || ok=0
    size=$(stat -c %s "$mb/ckpt" 2>&1 || true)
    if [ $ok = 0 ] || [ "$size" != "$want" ]; then
        echo "round $i: writers ok=$ok, size $size, want $want"
        bad=$((bad + 1))
    fi
    rm -rf "${ma:?}"/ckpt*
done
echo "plfs-gluster-create-race: $bad of $rounds rounds went wrong (bs $bs, backing GlusterFS)"
[ $bad = 0 ]
