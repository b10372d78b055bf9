#!/usr/bin/env bash
# Builds everything and runs every test (unit, property, real FUSE mounts).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/deps.sh
# The preload shim (.so) and the exerciser binary must exist before the
# integration tests start.
cargo build --workspace --all-targets
cargo test --workspace -- --test-threads="${MAPFS_TEST_THREADS:-4}"
