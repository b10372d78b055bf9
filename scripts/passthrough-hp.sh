#!/usr/bin/env bash
# Builds libfuse's example/passthrough_hp, the benchmark peer of the
# `passthrough_hp` and `passthrough_hp-uring` rows of `mapfs bench`
# (docs/metadata.md, "The strongest peer"), with FUSE over io_uring built in
# (libfuse 3.18 or later; Debian 12's fuse3 3.14 has neither the example nor
# io_uring).
#
#   bash scripts/passthrough-hp.sh [SRC_DIR [BUILD_DIR]]
#
# SRC_DIR is a libfuse source tree: a git checkout or an unpacked release
# tarball (https://github.com/libfuse/libfuse/releases). Without it the
# script clones https://github.com/libfuse/libfuse (--depth 1) into
# BUILD_DIR/src, which needs network access; offline, give a local copy.
# BUILD_DIR (default /var/tmp/passthrough-hp) is outside the repository;
# libfuse is linked statically into the binary, so the binary may be moved.
# Installs meson, ninja-build, liburing-dev, g++ and pkg-config with apt-get
# when one is missing (root).
#
# Prints the path of the binary on the last line. Then:
#
#   MAPFS_PASSTHROUGH_HP=/path/to/passthrough_hp mapfs bench \
#       --configs native,passthrough_hp,passthrough_hp-uring ...
#
# FUSE over io_uring also needs the kernel's switch (Linux 6.14+, root):
#   echo Y > /sys/module/fuse/parameters/enable_uring
set -euo pipefail

die() {
	echo "passthrough-hp.sh: $*" >&2
	exit 1
}

src=${1:-}
build=${2:-/var/tmp/passthrough-hp}

need=()
for tool in meson:meson ninja:ninja-build g++:g++ pkg-config:pkg-config; do
	command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
# liburing is optional to libfuse's build (it then silently leaves io_uring
# out), so it is looked for here rather than left to meson.
pkg-config --exists liburing 2>/dev/null || need+=(liburing-dev)
if ((${#need[@]})); then
	command -v apt-get >/dev/null ||
		die "missing ${need[*]} and no apt-get to install them"
	[[ $(id -u) == 0 ]] || die "missing ${need[*]}; as root: apt-get install -y ${need[*]}"
	echo "passthrough-hp.sh: installing ${need[*]}" >&2
	apt-get install -y "${need[@]}" >&2 ||
		die "apt-get install ${need[*]} failed (apt-get update first?)"
fi

mkdir -p "$build"
build=$(cd "$build" && pwd)
if [[ -z $src ]]; then
	src=$build/src
	if [[ ! -f $src/meson.build ]]; then
		command -v git >/dev/null || die "no SRC_DIR given and git is not installed"
		rm -rf "$src"
		git clone --depth 1 https://github.com/libfuse/libfuse "$src" >&2 ||
			die "cannot clone https://github.com/libfuse/libfuse (no network?); give a libfuse source tree as SRC_DIR"
	fi
fi
[[ -f $src/meson.build && -f $src/example/passthrough_hp.cc ]] ||
	die "$src is not a libfuse source tree (no meson.build or example/passthrough_hp.cc)"
grep -q "enable-io-uring" "$src/meson_options.txt" ||
	die "$src is a libfuse without FUSE over io_uring (3.18 or later is needed)"

# Only the example is built: no utilities (no setuid fusermount3 over the
# system's), no tests.
opts=(-Dexamples=true -Dtests=false -Dutils=false -Denable-io-uring=true
	-Ddefault_library=static -Dbuildtype=release -Duseroot=false
	-Dinitscriptdir=)
out=$build/meson
if [[ -f $out/build.ninja ]]; then
	meson configure "$out" "${opts[@]}" >&2
else
	meson setup "$out" "$src" "${opts[@]}" >&2
fi
# meson leaves io_uring out without a word if liburing lacks SQE128.
meson configure "$out" | grep -q "enable-io-uring *true" ||
	die "meson did not keep enable-io-uring=true"
grep -qs "define HAVE_URING" "$out/fuse_config.h" ||
	die "libfuse was configured without io_uring (liburing with SQE128 support needed)"
ninja -C "$out" example/passthrough_hp >&2

bin=$out/example/passthrough_hp
"$bin" --help 2>&1 | grep -q -- "-o io_uring" ||
	die "$bin does not offer -o io_uring"
if [[ $(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null) != Y ]]; then
	echo "passthrough-hp.sh: the kernel's FUSE over io_uring is off; as root:" \
		"echo Y > /sys/module/fuse/parameters/enable_uring" >&2
fi
echo "$bin"
