#!/usr/bin/env bash
# Starts a file system of your own: copies the template crate
# templates/concat (the program of docs/writing-a-file-system.md) to DEST,
# outside this repository, and points its mapfs dependencies at this
# checkout by absolute path. The repository's Cargo.lock goes along, so the
# new crate builds with the versions mapfs is tested with (and with
# `cargo build --offline` once this checkout has been built).
#   bash scripts/new-fs.sh DEST
#   cd DEST && cargo build && target/debug/concat --help
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=$1
if [ -e "$dest" ] && [ -n "$(ls -A "$dest")" ]; then
    echo "new-fs: $dest exists and is not empty" >&2
    exit 1
fi
mkdir -p "$dest"
cp -R "$repo/templates/concat/." "$dest/"
cp "$repo/Cargo.lock" "$dest/Cargo.lock"
# `path = "../../crates/X"` works only inside the repository.
sed -i "s|path = \"\.\./\.\./crates/|path = \"$repo/crates/|" "$dest/Cargo.toml"
if grep -q 'path = "\.\./' "$dest/Cargo.toml"; then
    echo "new-fs: a relative path is left in $dest/Cargo.toml" >&2
    exit 1
fi
echo "new-fs: $dest made from templates/concat; rename the crate and the"
echo "new-fs: program in Cargo.toml and in registry() (src/fs.rs), then cargo build"
