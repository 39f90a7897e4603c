#!/usr/bin/env bash
# The layout's include rule (check_includes.py) and naming rules
# (check_names.py) on the tree, and on a copy of a few files that break
# them, which they must name.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
T=$(mktemp -d /tmp/keylane-layout-XXXXXX)
trap 'rm -rf "$T"' EXIT
python3 "$HERE/check_includes.py" "$SRC"
python3 "$HERE/check_names.py" "$SRC"
mkdir -p "$T/store" "$T/worker"
printf '#include "worker/lanes.h"\n' >"$T/store/store.c"
printf '#include "store/store_internal.h"\n' >"$T/worker/apply.c"
if out=$(python3 "$HERE/check_includes.py" "$T"); then
  echo "FAILED: an include of worker/ from store/ passed: $out"
  exit 1
fi
grep -q 'store/store.c:1: includes "worker/lanes.h"' <<<"$out" ||
  { echo "FAILED: the message does not name the file and include: $out"; exit 1; }
echo "ok: an include of worker/ from store/ is refused, named"

mkdir -p "$T/n/common" "$T/n/worker"
printf 'static int kl_find(int x) {\n  return x;\n}\n' >"$T/n/common/a.c"
printf 'static int\nfind(int x);\n' >"$T/n/worker/b.c"
printf 'static int find(int x) {\n  return x;\n}\n' >"$T/n/worker/c.c"
if out=$(python3 "$HERE/check_names.py" "$T/n"); then
  echo "FAILED: a static kl_ function and a name defined twice passed: $out"
  exit 1
fi
grep -q 'common/a.c:1: static function kl_find has the public kl_ prefix' \
  <<<"$out" || { echo "FAILED: the kl_ prefix is not named: $out"; exit 1; }
grep -q 'worker/c.c:1: static function find is defined again (first at worker/b.c:2)' \
  <<<"$out" || { echo "FAILED: the name defined twice is not named: $out"; exit 1; }
echo "ok: a static kl_ function and a static name defined twice are refused, named"

# The simulator's mutants (common/mutant.h) exist only in keylane-sim's
# build: the library holds no mutant symbol, exported or hidden. The same
# check on keylane-sim must find its switch, or it proves nothing.
BUILD=${KEYLANE_BUILD_DIR:-$SRC/build}
mutant_symbols() { nm "$1" 2>/dev/null | grep -i 'mutant' || true; }
LIB=$BUILD/lib/libkeylane.so
[ -e "$LIB" ] || { echo "FAILED: no $LIB: build first, or set KEYLANE_BUILD_DIR"; exit 1; }
if [ -n "$(mutant_symbols "$LIB")" ] || nm -D "$LIB" | grep -i mutant >/dev/null; then
  echo "FAILED: $LIB holds the simulator's mutants (compile them into keylane-sim only, tests/CMakeLists.txt):"
  mutant_symbols "$LIB"
  exit 1
fi
SIM=$BUILD/bin/keylane-sim
if [ -e "$SIM" ]; then
  mutant_symbols "$SIM" | grep 'kl__sim_mutant' >/dev/null ||
    { echo "FAILED: the check finds no kl__sim_mutant in $SIM either"; exit 1; }
fi
echo "ok: libkeylane.so holds no mutant; keylane-sim does"

# The store interface is the only way to a backend (check_backends.py):
# outside store/ no libpq or LMDB call and no backend header; handlers/ may
# call libpq on the connection kl_txn_pg_conn() lends, tests/ is not read.
python3 "$HERE/check_backends.py" "$SRC"
B=$T/backends
mkdir -p "$B/store" "$B/worker" "$B/cli" "$B/handlers" "$B/common"
printf '#include "store/pg.h"\nvoid f(void) { PQclear(PQexec(0, "SAVEPOINT x")); }\n' \
  >"$B/worker/apply.c"
printf '#include "store/lmdb_ids.h"\nint g(void) { return mdb_txn_id(0); }\n' \
  >"$B/cli/main.c"
printf '#include <libpq-fe.h>\n#include "store/backend.h"\nvoid h(PGconn *pg) { PQclear(PQexec(pg, "SELECT 1")); }\n' \
  >"$B/handlers/sql.c"
printf '#include <libpq-fe.h>\nvoid s(PGconn *pg) { PQclear(PQexec(pg, "SELECT 1")); }\n' \
  >"$B/store/pg.c"
printf '/* as PQstatus() says */\nconst char *c = "PQexec(";\n' >"$B/common/text.c"
if out=$(python3 "$HERE/check_backends.py" "$B"); then
  echo "FAILED: a libpq call and backend headers outside store/ passed: $out"
  exit 1
fi
for want in \
  'worker/apply.c:1: includes store/pg.h, which only the store' \
  'worker/apply.c:2: calls PQexec() (libpq) outside store/' \
  'worker/apply.c:2: calls PQclear() (libpq) outside store/' \
  'cli/main.c:1: includes store/lmdb_ids.h' \
  'cli/main.c:2: calls mdb_txn_id() (LMDB) outside store/' \
  'handlers/sql.c:2: includes store/backend.h'; do
  grep -qF "$want" <<<"$out" ||
    { echo "FAILED: check_backends.py does not say \"$want\": $out"; exit 1; }
done
if grep -E 'store/pg\.c|common/text\.c|handlers/sql\.c:(1|3)' <<<"$out"; then
  echo "FAILED: check_backends.py refused store/, a comment or a string, or a handler's libpq: $out"
  exit 1
fi
echo "ok: libpq and LMDB calls and backend headers outside store/ are refused, named"
