#!/bin/sh
# Builds a program against keylane the three ways a user can: with
# pkg-config and with find_package (keylane::keylane) against the build
# installed into a temporary prefix, and with add_subdirectory of this
# source tree (keylane::keylane in-tree, keylane's tests off); and that
# the installed keylane.pc names what libkeylane.so links, nothing more,
# and that the soname and version are a release's of this ABI alone.
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
built=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")

# check_pc NAME LIBDIR: LIBDIR/pkgconfig/keylane.pc (NAME in the messages)
# names what LIBDIR/libkeylane.so links and nothing more (issue 38: an
# embedder links no libuv for a gateway it does not get): each module of
# its Requires.private gives a library the .so links (readelf NEEDED), and
# each library the .so links, but the C library's own, is given by one.
check_pc() {
  pc_bad=0
  needed=$(readelf -d "$2/libkeylane.so" |
    sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  given=""
  for mod in $(PKG_CONFIG_PATH="$2/pkgconfig" pkg-config \
    --print-requires-private keylane); do
    used=0
    for l in $(pkg-config --libs-only-l "$mod"); do
      given="$given lib${l#-l}.so"
      case " $(echo $needed) " in *" lib${l#-l}.so"*) used=1 ;; esac
    done
    [ "$used" = 1 ] || {
      echo "FAILED: $1 requires $mod, which libkeylane.so does not link: remove it from Requires.private in cmake/keylane.pc.in" >&2
      pc_bad=1
    }
  done
  for so in $needed; do
    case $so in libc.so* | ld-linux* | libm.so* | libpthread.so* | libdl.so* | librt.so*) continue ;; esac
    case "$given " in *" ${so%%.so*}.so "*) continue ;; esac
    echo "FAILED: libkeylane.so links $so, which no module of $1's Requires.private gives (pkg-config --libs --static keylane misses it): add its pkg-config module there in cmake/keylane.pc.in" >&2
    pc_bad=1
  done
  if [ "$pc_bad" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
check_pc keylane.pc "$lib"
# The check itself, on a keylane.pc that requires libuv and not lmdb: both
# are named (its failures are not the real counts).
mkdir -p "$tmp/badpc/pkgconfig"
ln -s "$lib/libkeylane.so" "$tmp/badpc/libkeylane.so"
sed 's/^Requires.private: \(.*\)lmdb/Requires.private: \1libuv/' \
  "$lib/pkgconfig/keylane.pc" >"$tmp/badpc/pkgconfig/keylane.pc"
was_passed=$passed was_failed=$failed
check_pc "a planted keylane.pc" "$tmp/badpc" 2>"$tmp/badpc.err"
planted=$failed
passed=$was_passed failed=$was_failed
if [ "$planted" = $((failed + 1)) ] &&
  grep -q 'a planted keylane.pc requires libuv, which libkeylane.so does not link' \
    "$tmp/badpc.err" &&
  grep -q 'libkeylane.so links liblmdb.so.*, which no module' "$tmp/badpc.err"; then
  passed=$((passed + 1))
else
  echo "FAILED: check_pc did not name what a keylane.pc that requires libuv and not lmdb gets wrong: $(cat "$tmp/badpc.err")" >&2
  failed=$((failed + 1))
fi

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

cmake -S "$here" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DKEYLANE_WANT="${built%.*}" >/dev/null
cmake --build "$tmp/cm" >/dev/null
LD_LIBRARY_PATH="$lib" check find_package "$tmp/cm/consumer"

# The soname is the ABI (CMakeLists.txt, KL_SOVERSION): before 1.0 each
# 0.y release is an ABI of its own, libkeylane.so.0.y, from 1.0 on
# libkeylane.so.MAJOR. The installed library's soname is that of
# keylane.pc's version, which is the build's; the pkg-config program above
# needs it by that name; and no release whose ABI differs from the tree's
# (OTHER_ABI: version and the soname it shipped) has its version or its
# soname installed, so that a program built against it fails to load
# instead of passing the old arguments (0.1.0: kl_worker_stats() without
# the struct's size, kl_conf_set() with an errstr, the _key twins).
OTHER_ABI="0.1.0:libkeylane.so.0"
soname_check() {
  version=$(PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --modversion keylane)
  soname=$(readelf -d "$lib/libkeylane.so" |
    sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  major=${version%%.*} minor=${version#*.}
  minor=${minor%%.*}
  want=libkeylane.so.$major
  [ "$major" != 0 ] || want=libkeylane.so.0.$minor
  [ "$version" = "$built" ] || {
    echo "FAILED: keylane.pc says version $version, the build is $built: cmake/keylane.pc.in's Version is @PROJECT_VERSION@" >&2
    return 1
  }
  [ "$soname" = "$want" ] || {
    echo "FAILED: libkeylane.so $version has the soname $soname, not $want: set SOVERSION from KL_SOVERSION in CMakeLists.txt" >&2
    return 1
  }
  readelf -d "$tmp/pc" | grep -q "(NEEDED).*\[$soname\]" || {
    echo "FAILED: a program built with pkg-config does not need $soname: $(readelf -d "$tmp/pc" | grep NEEDED)" >&2
    return 1
  }
  for rel in $OTHER_ABI; do
    if [ "$version" = "${rel%%:*}" ] || [ "$soname" = "${rel#*:}" ] ||
      [ -e "$lib/${rel#*:}" ]; then
      echo "FAILED: the library installs as $version, $soname, but ${rel%%:*} shipped ${rel#*:} with another ABI: raise the version in CMakeLists.txt's project() (0.y+1 before 1.0), which gives the soname" >&2
      return 1
    fi
  done
  echo "ok: libkeylane.so $version installs as $soname, which no release of another ABI had"
}
if soname_check; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
# A project asking find_package for a release of another ABI is refused.
for rel in $OTHER_ABI; do
  v=${rel%%:*}
  if cmake -S "$here" -B "$tmp/old" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    -DKEYLANE_WANT="${v%.*}" >"$tmp/old.log" 2>&1; then
    echo "FAILED: find_package(keylane ${v%.*}) took the $built install, of another ABI: set keylaneConfigVersion.cmake's COMPATIBILITY from KL_COMPATIBILITY in CMakeLists.txt" >&2
    failed=$((failed + 1))
  elif grep -q 'considered but not accepted' "$tmp/old.log" &&
    grep -qF "version: $built" "$tmp/old.log"; then
    passed=$((passed + 1))
  else
    echo "FAILED: find_package(keylane ${v%.*}) failed for another reason: $(tail -n 20 "$tmp/old.log")" >&2
    failed=$((failed + 1))
  fi
  rm -rf "$tmp/old"
done

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
echo "keylane as a dependency (keylane.pc's Requires.private, pkg-config, exports, find_package, add_subdirectory): $passed passed, $failed failed"
[ "$failed" -eq 0 ]
