#!/usr/bin/env bash
# Installs what mapfs needs on a fresh Debian machine (idempotent).
set -euo pipefail
need=()
for pair in fusermount3:fuse3 mkfs.xfs:xfsprogs mkfs.btrfs:btrfs-progs filefrag:e2fsprogs fio:fio bindfs:bindfs sqlite3:sqlite3 git:git python3:python3 tar:tar diff:diffutils setpriv:util-linux fincore:util-linux-extra make:make cc:gcc readelf:binutils glusterd:glusterfs-server glusterfs:glusterfs-client systemd-analyze:systemd gdb:gdb; do
    cmd=${pair%%:*}; pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "deps: installing ${need[*]}" >&2
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        echo "deps: cargo is in ~/.cargo/bin; add it to PATH" >&2
    else
        echo "deps: Rust is missing: install it with rustup (https://rustup.rs)" >&2
        exit 1
    fi
fi
if [ ! -e /dev/fuse ]; then
    modprobe fuse 2>/dev/null || true
    [ -e /dev/fuse ] || { echo "deps: /dev/fuse is missing; FUSE tests cannot run" >&2; exit 1; }
fi
