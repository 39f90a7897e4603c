#!/bin/sh
# Installs the build into a temporary prefix, then builds a program against
# it twice: with pkg-config (keylane.pc) and with CMake (keylane::keylane).
# Usage: test_install.sh BUILD_DIR
set -eu
build=$1
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
tmp=$(mktemp -d /tmp/keylane-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
lib=$(ls -d "$tmp"/prefix/lib*/ | head -n1)
export LD_LIBRARY_PATH="$lib"

PKG_CONFIG_PATH="$lib/pkgconfig" cc -std=c11 -o "$tmp/pc" "$here/consumer.c" \
  $(PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --cflags --libs keylane)
out=$("$tmp/pc")
[ "$out" = "KL_EFENCED ok" ] || { echo "pkg-config build printed: $out" >&2; exit 1; }

cmake -S "$here" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm" >/dev/null
out=$("$tmp/cm/consumer")
[ "$out" = "KL_EFENCED ok" ] || { echo "CMake build printed: $out" >&2; exit 1; }
echo "installed package builds with pkg-config and find_package: 2 passed, 0 failed"
