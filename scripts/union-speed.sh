#!/usr/bin/env bash
# The union example's data path against the same backing files used
# natively: fio psync random reads (both layers) and writes (upper), 4k and
# 128k, warm page cache, through the mount (kernel passthrough) and under
# `union run`; median of ROUNDS alternating rounds. Needs a release build
# (`cargo build --release --workspace --examples`) and fio.
# Usage: bash scripts/union-speed.sh [WORKDIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
U=$PWD/target/release/examples/union
W=${1:-/var/tmp/mapfs-union-speed}
ROUNDS=${2:-3}
mkdir -p "$W/upper" "$W/lower" "$W/mnt"
for f in lower/l.dat upper/u.dat; do
    [ -s "$W/$f" ] || fio --name=p --filename="$W/$f" --size=256M --rw=write --bs=1M --output=/dev/null
done
"$U" mount union "$W/upper:$W/lower" "$W/mnt"
trap '"$U" umount "$W/mnt"' EXIT
cat "$W/lower/l.dat" "$W/upper/u.dat" "$W/mnt/l.dat" "$W/mnt/u.dat" > /dev/null
mbps() { # FILE RW BS -> MB/s
    fio --name=t --filename="$1" --rw="$2" --bs="$3" --size=256M --time_based --runtime=3 \
        --ioengine=psync --invalidate=0 --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print((j["read"]["bw_bytes"]+j["write"]["bw_bytes"])/1e6)'
}
med() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
echo "| workload | layer | native MB/s | mount | union run |"
echo "|---|---|---|---|---|"
for rw in randread randwrite; do for bs in 4k 128k; do for layer in lower upper; do
    [ "$rw" = randwrite ] && [ "$layer" = lower ] && continue  # a write copies up
    f=${layer:0:1}.dat; n=(); m=(); p=()
    for _ in $(seq "$ROUNDS"); do
        n+=("$(mbps "$W/$layer/$f" $rw $bs)")
        m+=("$(mbps "$W/mnt/$f" $rw $bs)")
        p+=("$("$U" run --mount "$W/mnt" -- bash -c "$(declare -f mbps); mbps '$W/mnt/$f' $rw $bs")")
    done
    N=$(med "${n[@]}"); M=$(med "${m[@]}"); P=$(med "${p[@]}")
    python3 -c "print(f'| $rw $bs | $layer | {$N:.0f} | {$M/$N:.2f}x | {$P/$N:.2f}x |')"
done; done; done
