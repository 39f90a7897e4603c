#!/usr/bin/env bash
# The Makefile's promises about dependencies and configuration:
#  - flags given to an existing build directory are applied (CI's
#    -DKEYLANE_WERROR=ON is not ignored because a CMakeCache.txt exists);
#  - plain `make` checks only what building needs (install-deps.sh --build);
#  - install-deps.sh runs apt-get only for a package that is missing (with
#    dpkg-query, id and apt-get replaced by stubs that record their calls).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
passed=0 failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }
T=$(mktemp -d /tmp/keylane-make-XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$SRC"

# ---- flags reach an existing build directory
b=$T/build
quiet="-DKEYLANE_BUILD_TESTS=OFF -DCMAKE_C_FLAGS="
if make -s configure BUILD="$b" CMAKE_FLAGS="$quiet -DKEYLANE_WERROR=OFF" >"$T/1.log" 2>&1 &&
  make -s configure BUILD="$b" CMAKE_FLAGS="$quiet -DKEYLANE_WERROR=ON" >"$T/2.log" 2>&1; then
  if grep -q '^KEYLANE_WERROR:BOOL=ON$' "$b/CMakeCache.txt"; then
    ok "make configure CMAKE_FLAGS=-DKEYLANE_WERROR=ON applies to an existing cache"
  else
    bad "an existing cache kept $(grep '^KEYLANE_WERROR:' "$b/CMakeCache.txt")"
  fi
else
  bad "make configure failed: $(tail -n 20 "$T"/*.log)"
fi

# ---- plain make checks the build dependencies only
if grep -q 'install-deps.sh --build' <(make -n configure BUILD="$b"); then
  ok "make configure checks install-deps.sh --build"
else
  bad "make configure does not use install-deps.sh --build: $(make -n configure BUILD="$b" | head -n 3)"
fi

# ---- install-deps.sh asks apt-get only for what is missing
mkdir -p "$T/bin"
cat >"$T/bin/dpkg-query" <<'STUB'
#!/bin/sh
# the last argument is the package; those in $MISSING are not installed
for pkg; do :; done
for p in $MISSING; do [ "$p" = "$pkg" ] && exit 1; done
printf 'install ok installed'
STUB
cat >"$T/bin/apt-get" <<'STUB'
#!/bin/sh
echo "$*" >>"$CALLS"
STUB
printf '#!/bin/sh\necho 0\n' >"$T/bin/id"
chmod +x "$T"/bin/*
export CALLS=$T/calls
if PATH="$T/bin:$PATH" MISSING='' deploy/install-deps.sh --build >/dev/null 2>&1 &&
  [ ! -e "$CALLS" ]; then
  ok "install-deps.sh with everything present runs no apt-get"
else
  bad "install-deps.sh with everything present ran: $(cat "$CALLS" 2>/dev/null)"
fi
rm -f "$CALLS"
if PATH="$T/bin:$PATH" MISSING='liblmdb-dev' deploy/install-deps.sh --build >/dev/null 2>&1 &&
  grep -q 'install .*liblmdb-dev$' "$CALLS" && [ "$(grep -c . "$CALLS")" -eq 2 ]; then
  ok "install-deps.sh installs the one missing package"
else
  bad "install-deps.sh with liblmdb-dev missing ran: $(cat "$CALLS" 2>/dev/null)"
fi

echo "make and install-deps.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
