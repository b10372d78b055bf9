#!/usr/bin/env bash
# The demo: builds mapfs, mounts the passthrough file system over a temporary
# directory, uses it, runs a short benchmark and prints the speed table, then
# unmounts.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/deps.sh
cargo build --release --workspace
MAPFS="$PWD/target/release/mapfs"
work=$(mktemp -d /var/tmp/mapfs-demo.XXXXXX)
cleanup() {
    "$MAPFS" umount "$work/mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/backing" "$work/mnt"
echo "== mapfs mount passthrough $work/backing $work/mnt"
"$MAPFS" mount passthrough "$work/backing" "$work/mnt"
grep " $work/mnt " /proc/mounts
echo "hello through mapfs" > "$work/mnt/hello.txt"
echo "== written through the mount, read from the backing dir:"
cat "$work/backing/hello.txt"
"$MAPFS" umount "$work/mnt"
echo "== mapfs bench --quick (native vs FUSE daemon vs kernel passthrough vs bindfs)"
"$MAPFS" bench --quick --out "$work/bench"
