#!/usr/bin/env bash
# Builds everything and runs every test (unit, property, real FUSE mounts),
# then prints one line per test binary and fails when any test failed, any
# binary did not finish, or any test skipped without being listed in
# tests/allowed-skips.txt.
#
# Extra arguments replace `--workspace` for a quicker run of part of the
# suite, e.g. `bash scripts/test.sh -p mapfs-cli --test exclusive`.
#
# MAPFS_TRANSPORT=uring|dev in the environment is the transport of every
# mount that names none (docs/transport.md): unset, /dev/fuse;
# `MAPFS_TRANSPORT=uring bash scripts/test.sh -p mapfs-cli --test posix`
# runs those tests over io_uring.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/deps.sh
scope=(--workspace)
[ $# -gt 0 ] && scope=("$@")
# The preload shim (.so) and the exerciser binary must exist before the
# integration tests start.
cargo build "${scope[@]}" --all-targets
log_dir=${MAPFS_TEST_LOG_DIR:-$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')}
mkdir -p "$log_dir"
log=$log_dir/test.log
map=$log_dir/test-binaries.json
# Which package and target each test binary belongs to: two crates may both
# have a tests/versions.rs, and the skip list names tests by package.
cargo test "${scope[@]}" --no-run --message-format=json >"$map"
echo "test.sh: full output in $log; transport: ${MAPFS_TRANSPORT:-default}" >&2
# libtest keeps what a passing test printed to itself unless asked:
# --show-output prints it after the run under the test's name, which is
# how a skip (a `SKIPPED <test>: <reason>` line) is seen and attributed.
set +e
cargo test "${scope[@]}" --no-fail-fast -- \
    --show-output --test-threads="${MAPFS_TEST_THREADS:-4}" 2>&1 | tee "$log"
cargo_status=${PIPESTATUS[0]}
set -e
if [ $# -eq 0 ] && [ -z "${MAPFS_TRANSPORT:-}" ]; then
    # The main pass serves mounts over /dev/fuse (the default): the POSIX,
    # exerciser, program and error-path tests again, every mount on FUSE
    # over io_uring (docs/transport.md). Their lines in the summary
    # are prefixed `uring:`.
    echo "test.sh: pass transport=uring" | tee -a "$log"
    set +e
    MAPFS_TRANSPORT=uring cargo test --workspace --no-fail-fast \
        --test posix --test fsx --test stats --test programs --test rough_edges -- \
        --show-output --test-threads="${MAPFS_TEST_THREADS:-4}" 2>&1 | tee -a "$log"
    uring_status=${PIPESTATUS[0]}
    set -e
    [ "$cargo_status" -ne 0 ] || cargo_status=$uring_status
fi
loom_status=0
if [ $# -eq 0 ]; then
    # The model checks of the lock-free code (mapfs-interpose's seqlock):
    # a build of their own, with loom's atomics in place of the CPU's.
    echo "test.sh: loom model checks (mapfs-interpose seqlock, fdslots)" >&2
    set +e
    RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$log_dir/loom" \
        cargo test -p mapfs-interpose --release --lib -- seqlock fdslots 2>&1 | tee "$log_dir/loom.log"
    loom_status=${PIPESTATUS[0]}
    set -e
    [ "$loom_status" -eq 0 ] || echo "test.sh: loom model checks FAILED (status $loom_status)" >&2
fi
python3 scripts/test-summary.py "$log" "$map" tests/allowed-skips.txt "$cargo_status"
exit "$loom_status"
