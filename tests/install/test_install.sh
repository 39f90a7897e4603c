#!/bin/sh
# Builds a program against keylane the three ways a user can: with
# pkg-config and with find_package (keylane::keylane) against the build
# installed into a temporary prefix, and with add_subdirectory of this
# source tree (keylane::keylane in-tree, keylane's tests off).
# Usage: test_install.sh BUILD_DIR
set -eu
build=$1
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
src=$(CDPATH='' cd -- "$here/../.." && pwd)
tmp=$(mktemp -d /tmp/keylane-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
. "$here/check.sh"

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
lib=$(ls -d "$tmp"/prefix/lib*/ | head -n1)

# Strict: the public headers compile without a warning in a user's program,
# and a call whose declaration is missing is an error, not an implicit one.
PKG_CONFIG_PATH="$lib/pkgconfig" cc -std=c11 -Wall -Wextra -Werror \
  -o "$tmp/pc" "$here/consumer.c" \
  $(PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --cflags --libs keylane)
LD_LIBRARY_PATH="$lib" check pkg-config "$tmp/pc"

# The library exports what the installed headers declare KL_EXPORT, and
# nothing else: no internal call, and no call a header lost (a removed
# twin) still reachable by name.
nm -D --defined-only "$lib"/libkeylane.so | awk '{print $3}' | sort \
  >"$tmp/exported"
sed -n 's/.*KL_EXPORT[^(]*[^a-z0-9_]\(kl_[a-z0-9_]*\)(.*/\1/p' \
  "$tmp"/prefix/include/keylane/*.h | sort >"$tmp/declared"
if [ -s "$tmp/declared" ] && cmp -s "$tmp/exported" "$tmp/declared"; then
  passed=$((passed + 1))
else
  echo "FAILED: libkeylane.so's exports differ from the headers' KL_EXPORT" \
    "declarations (< exported only, > declared only):" >&2
  diff "$tmp/exported" "$tmp/declared" >&2 || true
  failed=$((failed + 1))
fi

cmake -S "$here" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm" >/dev/null
LD_LIBRARY_PATH="$lib" check find_package "$tmp/cm/consumer"

# In-tree: only the consumer and the library it needs are built.
if ! cmake -S "$here" -B "$tmp/sub" -DKEYLANE_SOURCE_DIR="$src" \
  >"$tmp/sub.log" 2>&1 ||
  ! cmake --build "$tmp/sub" -j "${KEYLANE_TEST_JOBS:-2}" --target consumer \
    >>"$tmp/sub.log" 2>&1; then
  tail -n 30 "$tmp/sub.log" >&2
  echo "FAILED: the add_subdirectory build" >&2
  failed=$((failed + 1))
else
  [ ! -e "$tmp/sub/keylane/tests" ] || {
    echo "FAILED: add_subdirectory configured keylane's tests" >&2
    failed=$((failed + 1))
  }
  check add_subdirectory "$tmp/sub/consumer"
fi
echo "keylane as a dependency (pkg-config, exports, find_package, add_subdirectory): $passed passed, $failed failed"
[ "$failed" -eq 0 ]
