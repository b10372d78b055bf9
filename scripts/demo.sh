#!/usr/bin/env bash
# The demo: builds mapfs, mounts the passthrough file system over a temporary
# directory, uses it, runs a short benchmark and prints the speed table, then
# unmounts. The release build dominates: 5 to 15 minutes on a fresh 2-core
# machine, then a few minutes for the benchmark. The benchmark results stay
# in /var/tmp/mapfs-demo.*/bench (the path is printed at the end). Honours
# CARGO_TARGET_DIR (and a target-dir set in cargo's configuration).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
start=$(date +%s)
echo "== mapfs demo: builds a release first (5-15 minutes on 2 cores), then mounts and benchmarks"
bash scripts/deps.sh
cargo build --release --workspace
# Where cargo put the build: CARGO_TARGET_DIR or build.target-dir move it.
target_dir=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
MAPFS="${target_dir:-$PWD/target}/release/mapfs"
work=$(mktemp -d /var/tmp/mapfs-demo.XXXXXX)
cleanup() {
    "$MAPFS" umount "$work/mnt" 2>/dev/null || true
    # The benchmark results are kept; only the scratch directories go.
    rm -rf "$work/backing" "$work/mnt"
}
trap cleanup EXIT
mkdir -p "$work/backing" "$work/mnt"
echo "== mapfs mount passthrough $work/backing $work/mnt"
"$MAPFS" mount passthrough "$work/backing" "$work/mnt"
findmnt -t fuse.mapfs "$work/mnt"
"$MAPFS" list "$work/mnt"
echo "hello through mapfs" > "$work/mnt/hello.txt"
echo "== written through the mount, read from the backing dir:"
cat "$work/backing/hello.txt"
"$MAPFS" umount "$work/mnt"
echo "== mapfs bench --quick: native (the backing dir), fuse (mapfs, data through the daemon),"
echo "   passthrough (mapfs, kernel FUSE passthrough), bindfs (a reference FUSE file system),"
echo "   preload (the workload under \`mapfs run\`, data in the process)"
"$MAPFS" bench --quick --out "$work/bench"
echo "== results kept in $work/bench (results.md, results.json, one SVG chart per workload)"
echo "== demo took $(( $(date +%s) - start )) s"
