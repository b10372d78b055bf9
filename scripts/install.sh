#!/usr/bin/env bash
# Installs mapfs under PREFIX (default /usr/local):
#   PREFIX/bin/mapfs
#   PREFIX/lib/mapfs/libmapfs_preload.so   (found by `mapfs run` relative to bin/)
#   PREFIX/lib/mapfs/libmapfs_embed_builtins.so (`mapfs run --embed`, when built)
#   PREFIX/lib/mapfs/libmapfs_embed_full.so (`mapfs run --embed versions:...`, when built)
#   PREFIX/share/man/man1/mapfs*.1
#   PREFIX/share/{bash-completion,zsh,fish}/... completions
#   PREFIX/lib/systemd/system/mapfs@.service
# Builds with the `dist` profile first (the release profile with
# whole-program optimisation: Cargo.toml); MAPFS_BUILD_DIR=DIR installs
# binaries already built there instead (the tests use their debug build).
# Honours CARGO_TARGET_DIR (and a target-dir set in cargo's configuration).
# `mount -t fuse.mapfs` and fstab lines work through mount.fuse3 (package
# fuse3), which runs `mapfs` from root's default PATH: install with a PREFIX
# whose bin/ is on it (/usr/local, /usr), or link PREFIX/bin/mapfs there.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX="${1:-/usr/local}"
if [ -n "${MAPFS_BUILD_DIR:-}" ]; then
    build="$MAPFS_BUILD_DIR"
else
    export PATH="$HOME/.cargo/bin:$PATH"
    cargo build --profile dist -p mapfs-cli -p mapfs-preload -p mapfs-embed-builtins -p mapfs-embed-full
    # Where cargo put the build: CARGO_TARGET_DIR or build.target-dir move it.
    target_dir=$(cargo metadata --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    build="${target_dir:-target}/dist"
fi
for f in mapfs libmapfs_preload.so; do
    [ -f "$build/$f" ] || { echo "install: $build/$f is missing (cargo build --workspace)" >&2; exit 1; }
done
install -d "$PREFIX/bin" "$PREFIX/lib/mapfs" "$PREFIX/share/man/man1" \
    "$PREFIX/share/bash-completion/completions" "$PREFIX/share/zsh/site-functions" \
    "$PREFIX/share/fish/vendor_completions.d" "$PREFIX/lib/systemd/system"
install -m 0755 "$build/mapfs" "$PREFIX/bin/mapfs"
install -m 0644 "$build/libmapfs_preload.so" "$PREFIX/lib/mapfs/libmapfs_preload.so"
for lib in libmapfs_embed_builtins.so libmapfs_embed_full.so; do
    if [ -f "$build/$lib" ]; then
        install -m 0644 "$build/$lib" "$PREFIX/lib/mapfs/$lib"
    fi
done
mapfs="$PREFIX/bin/mapfs"
"$mapfs" manpages "$PREFIX/share/man/man1"
"$mapfs" completions bash > "$PREFIX/share/bash-completion/completions/mapfs"
"$mapfs" completions zsh > "$PREFIX/share/zsh/site-functions/_mapfs"
"$mapfs" completions fish > "$PREFIX/share/fish/vendor_completions.d/mapfs.fish"
sed "s|/usr/local/bin/mapfs|$PREFIX/bin/mapfs|" contrib/mapfs@.service \
    > "$PREFIX/lib/systemd/system/mapfs@.service"
"$mapfs" --version
echo "install: done; try \`$mapfs --help\`"
# mount(8) runs mount.fuse3, which finds `mapfs` on root's default PATH
# only (not the caller's): say so when PREFIX/bin is not on it.
root_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
case ":$root_path:" in
*":$PREFIX/bin:"*) ;;
*) echo "install: $PREFIX/bin is not on root's default PATH ($root_path):" \
        "\`mount -t fuse.mapfs\` and fstab lines will not find mapfs;" \
        "link it there: ln -s $mapfs /usr/local/bin/mapfs" >&2 ;;
esac
