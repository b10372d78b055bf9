#!/usr/bin/env bash
# N-1 strided vs N-N checkpoint writes over two GlusterFS "hosts":
# 4 writers (fio, psync), ranks 0 and 2 through host A, 1 and 3 through
# host B, each writing IO bytes in blocks of BS, fsynced at the end.
# Configurations, all on the same Gluster volume in the same run:
#   gluster-nn    N-N: a file per writer, on Gluster directly
#   gluster-n1    N-1 strided: one shared file, on Gluster directly
#   plfs-n1       N-1 strided through a plfs mount per host (hostid a, b)
#   plfs-run-n1   the same, the writers under `mapfs run` (the shim)
# Prints MB/s (total bytes / wall time) per configuration and block size,
# and the ratios the issue asks for. Needs root (Gluster, mounts).
#
#   scripts/plfs-gluster-bench.sh [IO_MIB] [REPEATS]   # default 16 MiB, 3
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
io_mib=${1:-16}
reps=${2:-3}
cargo build -q --workspace
mapfs=$CARGO_TARGET_DIR/debug/mapfs
if [ -x "$CARGO_TARGET_DIR/release/mapfs" ] && [ "${MAPFS_BENCH_RELEASE:-1}" = 1 ]; then
    cargo build -q --release -p mapfs-cli -p mapfs-preload
    mapfs=$CARGO_TARGET_DIR/release/mapfs
fi
gl=$(bash scripts/gluster.sh start) || { echo "plfs-gluster-bench: GlusterFS cannot run here" >&2; exit 2; }
ga=$(echo "$gl" | sed -n 1p)
gb=$(echo "$gl" | sed -n 2p)
run=bench-$$
mkdir -p "$ga/$run"
ma=$(mktemp -d /tmp/plfs-bench-a.XXXXXX)
mb=$(mktemp -d /tmp/plfs-bench-b.XXXXXX)
cleanup() {
    "$mapfs" umount "$ma" 2>/dev/null || true
    "$mapfs" umount "$mb" 2>/dev/null || true
    rmdir "$ma" "$mb" 2>/dev/null || true
    rm -rf "${ga:?}/$run"
}
trap cleanup EXIT
mkdir -p "$ga/$run/plfs"
"$mapfs" mount plfs "$ga/$run/plfs" "$ma" --data auto --ttl 0 -o hostid=a
"$mapfs" mount plfs "$gb/$run/plfs" "$mb" --data auto --ttl 0 -o hostid=b

# fio args of rank $1 writing $2 (file) in pattern $3 (n1|nn), block $4.
job() {
    local r=$1 f=$2 pat=$3 bs=$4 io=$((io_mib << 20))
    if [ "$pat" = n1 ]; then
        echo "--name=r$r --filename=$f --rw=write:$((3 * bs)) --offset=$((r * bs)) --size=$((4 * io)) --io_size=$io"
    else
        echo "--name=r$r --filename=$f.$r --rw=write --size=$io"
    fi
}

# One run: $1 config, $2 bs; prints MB/s.
one() {
    local cfg=$1 bs=$2 da db pat=n1 pre=()
    case $cfg in
    gluster-nn) da=$ga/$run/nn; db=$gb/$run/nn; pat=nn ;;
    gluster-n1) da=$ga/$run/n1; db=$gb/$run/n1 ;;
    plfs-n1) da=$ma; db=$mb ;;
    plfs-run-n1) da=$ma; db=$mb; pre=(run) ;;
    esac
    mkdir -p "$da"
    # create_on_open: fio's own layout removes and creates the file, and a
    # host starting a moment later removed the N-1 file the other had begun.
    local common="--ioengine=psync --bs=$bs --end_fsync=1 --output=/dev/null --create_on_open=1"
    local t0 t1
    t0=$(date +%s%N)
    local pa pb ok=1
    if [ ${#pre[@]} -gt 0 ]; then
        "$mapfs" run --mount "$ma" -- fio $common $(job 0 "$da/ckpt" $pat $bs) $(job 2 "$da/ckpt" $pat $bs) &
        pa=$!
        "$mapfs" run --mount "$mb" -- fio $common $(job 1 "$db/ckpt" $pat $bs) $(job 3 "$db/ckpt" $pat $bs) &
        pb=$!
    else
        fio $common $(job 0 "$da/ckpt" $pat $bs) $(job 2 "$da/ckpt" $pat $bs) &
        pa=$!
        fio $common $(job 1 "$db/ckpt" $pat $bs) $(job 3 "$db/ckpt" $pat $bs) &
        pb=$!
    fi
    wait "$pa" || ok=0
    wait "$pb" || ok=0
    t1=$(date +%s%N)
    # A run where a writer failed is no figure.
    if [ $ok = 0 ]; then
        rm -rf "${da:?}"/ckpt*
        echo ERR
        return
    fi
    # Check the size through host B: every writer's bytes are there.
    local want=$((4 * (io_mib << 20)))
    if [ $pat = n1 ]; then
        local got; got=$(stat -c %s "$db/ckpt")
        [ "$got" -ge "$want" ] || { echo "$cfg: size $got < $want" >&2; exit 1; }
    fi
    rm -rf "${da:?}"/ckpt*
    echo "scale=1; $want / 1048576 / (($t1 - $t0) / 1000000000)" | bc -l
}

echo "# plfs-gluster-bench: 4 writers over 2 Gluster hosts, ${io_mib} MiB each, median of $reps; backing GlusterFS (2 bricks on ext4, one machine)"
for bs in 4096 65536; do
    declare -A med=()
    for cfg in gluster-nn gluster-n1 plfs-n1 plfs-run-n1; do
        vals=()
        for _ in $(seq "$reps"); do vals+=("$(one $cfg $bs)"); done
        good=$(printf '%s\n' "${vals[@]}" | grep -v ERR || true)
        n=$(echo "$good" | grep -c . || true)
        med[$cfg]=$(echo "$good" | sort -n | sed -n "$(((n + 1) / 2))p")
        [ -n "${med[$cfg]}" ] || med[$cfg]=0
        echo "bs=$bs $cfg MB/s: ${vals[*]} (median ${med[$cfg]})"
    done
    echo "bs=$bs plfs-run-n1/gluster-nn = $(echo "scale=2; ${med[plfs-run-n1]} / ${med[gluster-nn]}" | bc -l)" \
        " plfs-run-n1/gluster-n1 = $(echo "scale=2; ${med[plfs-run-n1]} / ${med[gluster-n1]}" | bc -l)" \
        " plfs-n1/gluster-n1 = $(echo "scale=2; ${med[plfs-n1]} / ${med[gluster-n1]}" | bc -l)"
    unset med
done
