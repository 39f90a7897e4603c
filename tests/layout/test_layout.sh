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
python3 "$HERE/check_comments.py" "$SRC"
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

# refuses CHECKER TREE WHAT: CHECKER must fail on TREE; its output in $out.
refuses() {
  if out=$(python3 "$HERE/$1" "$2"); then
    echo "FAILED: $3 passed: $out"
    exit 1
  fi
}
# names TEXT WHAT: the output of the last refusal holds TEXT.
names() {
  grep -qF -- "$1" <<<"$out" || { echo "FAILED: $2 is not named: $out"; exit 1; }
}
# alone WHAT: the last refusal named one thing only; WHAT was not refused.
alone() {
  [ "$(wc -l <<<"$out")" = 1 ] || { echo "FAILED: $1 was refused: $out"; exit 1; }
}

# Header guards spell their header's path (check_names.py, guards()): a
# guard left from a header's old folder, and one right, side by side.
mkdir -p "$T/g/event" "$T/g/include/keylane"
printf '#ifndef KEYLANE_BROKER_TRACE_H\n#define KEYLANE_BROKER_TRACE_H\n#endif\n' \
  >"$T/g/event/trace.h"
printf '#ifndef KEYLANE_STORE_H\n#define KEYLANE_STORE_H\n#endif\n' \
  >"$T/g/include/keylane/store.h"
refuses check_names.py "$T/g" "a header guard of another path"
names "event/trace.h:1: header guard KEYLANE_BROKER_TRACE_H does not spell the header's path: name it KEYLANE_EVENT_TRACE_H" \
  "the stale guard"
if grep -q 'include/keylane/store.h' <<<"$out"; then
  echo "FAILED: the public header's guard KEYLANE_STORE_H was refused: $out"
  exit 1
fi
echo "ok: a header guard that does not spell its path is refused, named"

# A comment names only files that exist (check_comments.py): a C comment
# and a shell comment that name moved files, beside names that resolve (a
# bare name found in another folder, a path from a folder above, another
# project's path) and a # that is no comment.
mkdir -p "$T/c/store" "$T/c/tests/support" "$T/c/tests/unit"
printf '/* pg.c, lmdb.h */\n' >"$T/c/store/pg.c"
touch "$T/c/store/lmdb.h" "$T/c/tests/support/cluster.h"
printf '/*\n * see store_pg.c, support/cluster.h and librdkafka/rdkafka.h\n */\n' \
  >"$T/c/tests/unit/test_a.c"
printf '#!/bin/sh\n# the rule of store/backend.h\necho "#store/gone.h"\n' \
  >"$T/c/tests/unit/run.sh"
refuses check_comments.py "$T/c" "comments that name files that do not exist"
names "tests/unit/test_a.c:2: the comment names store_pg.c, which is no file of the repository: name where it is now (store/pg.c" \
  "the moved file"
names "tests/unit/run.sh:2: the comment names store/backend.h" "the shell comment's file"
[ "$(grep -c FAILED: <<<"$out")" = 2 ] ||
  { echo "FAILED: names that exist, or no comment, were refused: $out"; exit 1; }
echo "ok: a comment that names a file that does not exist is refused, named"

# An internal prefix named after a file lives in that file's folder, and in
# one folder only (check_names.py, prefixes()): worker/ defining kl__log_*
# of common/log.c, and replay.c in two folders both defining kl__replay_*;
# beside a prefix of a file of the same folder (kl__log_guard_*) and a
# declaration, which defines nothing.
mkdir -p "$T/p/common" "$T/p/worker" "$T/p/cli"
printf 'void kl__log(int level) {\n}\n' >"$T/p/common/log.c"
printf 'int kl__log_classify(int low);\nint kl__log_classify(int low) {\n  return low;\n}\n' \
  >"$T/p/worker/checks_log.c"
printf 'void kl__log_guard_new(void) {\n}\nvoid kl__log(int level);\n' \
  >"$T/p/worker/log_guard.c"
printf 'int kl__replay_run(void) {\n  return 0;\n}\n' >"$T/p/worker/replay.c"
printf 'int\nkl__replay_cli(int argc,\n               char **argv) {\n  return 0;\n}\n' \
  >"$T/p/cli/replay.c"
refuses check_names.py "$T/p" "internal prefixes of another folder's file"
names "worker/checks_log.c:2: kl__log_classify has the prefix kl__log_ of common/log.c, in another folder: name it after its own file (kl__checks_log_classify)" \
  "the prefix of another folder's file"
names "worker/replay.c:1: the prefix kl__replay_ is also defined at cli/replay.c:2, and cli/replay.c and worker/replay.c share its name" \
  "the prefix defined in two folders"
[ "$(wc -l <<<"$out")" = 2 ] ||
  { echo "FAILED: a prefix of the file's own folder was refused: $out"; exit 1; }
echo "ok: an internal prefix of another folder's file, or of two folders, is refused, named"

# An internal prefix named after a file is defined in that file or its
# parts, and a folder's own prefix in any of its files (check_names.py,
# prefixes()): the overlay's kl__ov_ defined by the child txn's file, as it
# was; beside a part of the overlay and store/'s own kl__store_ prefix.
mkdir -p "$T/f/store"
printf 'int kl__ov_get(int x) {\n  return x;\n}\n' >"$T/f/store/ov.c"
printf 'int kl__ov_walk(int x) {\n  return x;\n}\n' >"$T/f/store/ov_walk.c"
printf 'int kl__child_begin(int x) {\n  return x;\n}\nint kl__ov_set(int x) {\n  return x;\n}\n' \
  >"$T/f/store/child.c"
printf 'int kl__store_begin(int x) {\n  return x;\n}\n' >"$T/f/store/store.c"
printf 'int kl__store_pg_open(int x) {\n  return x;\n}\n' >"$T/f/store/pg.c"
refuses check_names.py "$T/f" "a prefix defined by another file of its folder"
names "store/child.c:4: kl__ov_set has the prefix kl__ov_ of store/ov.c: define it there (or in one of its parts, store/ov_*.c), or name it after its own file (kl__child_set)" \
  "the prefix of another file"
alone "a file's part or the folder's own prefix"
echo "ok: an internal prefix defined by a file that is not its file or a part of it is refused, named"

# A public function is declared in the header of the folder that defines
# it (check_names.py, declarations()): kl_partition() in keylane/producer.h
# and defined in event/, as it was; beside one in its place.
mkdir -p "$T/h/include/keylane" "$T/h/event"
printf '#ifndef KEYLANE_PRODUCER_H\n#define KEYLANE_PRODUCER_H\nKL_EXPORT int kl_partition(int key);\n#endif\n' \
  >"$T/h/include/keylane/producer.h"
printf '#ifndef KEYLANE_EVENT_H\n#define KEYLANE_EVENT_H\nKL_EXPORT int kl_murmur2(int key);\n#endif\n' \
  >"$T/h/include/keylane/event.h"
printf 'int kl_partition(int key) {\n  return key;\n}\nint kl_murmur2(int key) {\n  return key;\n}\n' \
  >"$T/h/event/partition.c"
refuses check_names.py "$T/h" "a public function declared in another folder's header"
names "include/keylane/producer.h: declares kl_partition(), which event/partition.c defines: declare it in keylane/event.h, or define it in broker/" \
  "the declaration away from its definition"
alone "a declaration in its folder's header"
echo "ok: a public function declared in another folder's header is refused, named"

# An engine's state is read by its parts only, named as its parts
# (check_names.py, parts()): the lanes' executors under their old name
# (pool), beside the lanes' own files, which may read it.
mkdir -p "$T/e/worker"
printf '#ifndef KEYLANE_WORKER_LANES_INTERNAL_H\n#define KEYLANE_WORKER_LANES_INTERNAL_H\n#endif\n' \
  >"$T/e/worker/lanes_internal.h"
printf '#include "worker/lanes.h"\n#include "worker/lanes_internal.h"\n' \
  >"$T/e/worker/pool.c"
printf '#include "worker/lanes_internal.h"\n' >"$T/e/worker/lanes_pool.c"
printf '#include "worker/lanes_internal.h"\n' >"$T/e/worker/lanes.c"
refuses check_names.py "$T/e" "a reader of the lanes' state not named as their part"
names "worker/pool.c:2: includes worker/lanes_internal.h, the state of the lanes engine, but is not named as one of its parts: name it worker/lanes_pool.c (functions kl__lanes_pool_*)" \
  "the file outside the lanes"
alone "a file of the lanes"
echo "ok: a reader of an engine's state not named as its part is refused, named"

# The data-path table of docs/design.md names where each step runs
# (check_datapath.py): true of the tree, and refused on a copy where a
# function it names was renamed, a step no longer calls the next, the
# handler is called through another pointer and a backend's commit is in
# no table.
python3 "$HERE/check_datapath.py" "$SRC"
D=$T/datapath
mkdir -p "$D/docs"
cp "$SRC/docs/design.md" "$D/docs/"
for f in common event store broker worker handlers cli; do cp -r "$SRC/$f" "$D/"; done
sed -i 's/^kl_handler_result_t kl__apply_event(/kl_handler_result_t kl__apply_one(/' \
  "$D/worker/apply.c"
sed -i 's/kl__apply_event(&x->applier/kl__apply_one(\&x->applier/' \
  "$D/worker/lanes_pool.c"
sed -i 's/^  kl__lanes_push(/  kl__lanes_add(/; s/^void kl__lanes_push(/void kl__lanes_add(/' \
  "$D/worker/lanes.c"
sed -i 's/kl__lanes_push(worker->lanes, /kl__lanes_add(worker->lanes, /' \
  "$D/worker/worker.c"
sed -i 's/kl__outbox_tick(lanes->outbox)/(void)lanes->outbox/' "$D/worker/lanes.c"
sed -i 's/: a->handler(a->handler_opaque/: a->run(a->handler_opaque/' \
  "$D/worker/apply.c"
sed -i '/\.commit_many = kl__lmdb_commit_many,/d' "$D/store/lmdb.c"
refuses check_datapath.py "$D" "a data-path table that is no longer true"
names "worker/apply.c defines no function kl__apply_event() (no source defines it): name the function the step runs now" \
  "the renamed function"
names "worker/lanes.c defines no function kl__lanes_push()" "the renamed lanes' function"
names "kl__outbox_tick() is not reached from kl__lanes_tick() (worker/lanes.c) through the calls of the sources" \
  "the step no longer called"
names "no source defines kl__apply_event()" "the renamed caller"
names "kl__lmdb_commit_many() is never installed as a value" \
  "the backend commit in no table"
sed -i 's/a->run(a->handler_opaque/a->handler(a->handler_opaque/; s/kl__apply_one(/kl__apply_event(/' \
  "$D/worker/apply.c"
sed -i 's/kl__apply_one(/kl__apply_event(/' "$D/worker/lanes_pool.c"
sed -i 's/: a->handler(a->handler_opaque/: a->run(a->handler_opaque/' \
  "$D/worker/apply.c"
sed -i 's/| `kl_ledger_handler()` |$/| `ledger_emit_credit()` |/' "$D/docs/design.md"
refuses check_datapath.py "$D" "a handler called through another pointer"
names "kl__apply_event() (worker/apply.c) does not call through a->handler" \
  "the handler's pointer"
names "the row is reached from ledger_emit_credit(), which no earlier row names" \
  "the caller of no earlier step"
echo "ok: a data-path table whose functions were renamed, or are no longer reached, is refused, named"

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

# The library holds its API only (check_library.py, issue 38): on the
# build's libkeylane.so and the archive it is linked from, and on a planted
# library that breaks each rule, which the check must name.
library_api() {
  local build=${KEYLANE_BUILD_DIR:-$SRC/build} l=$T/lib out
  python3 "$HERE/check_library.py" "$SRC" "$build/lib/libkeylane.so" \
    "$build/lib/libkeylane_static.a"
  # The executable exports the public API for `--handler so:` libraries
  # (ENABLE_EXPORTS), and no internal name such a library could bind to.
  out=$(nm -D --defined-only "$build/bin/keylane" | awk '$3 ~ /^kl__/ {print $3}')
  [ -z "$out" ] || {
    echo "FAILED: $build/bin/keylane exports internal names: $(echo $out): build the archive that holds them with C_VISIBILITY_PRESET hidden (CMakeLists.txt)"
    exit 1
  }
  echo "ok: the keylane executable exports no internal kl__ name"
  mkdir -p "$l/include/keylane" "$l/worker"
  printf '#define KL_EXPORT __attribute__((visibility("default")))\nKL_EXPORT int kl_a(void);\nKL_EXPORT int kl_gone(void);\n' \
    >"$l/include/keylane/a.h"
  printf '#include "keylane/a.h"\nint kl__b(void);\nint kl_a(void) {\n  return kl__b();\n}\n' \
    >"$l/worker/lanes.c"
  printf '__attribute__((visibility("default"))) int kl__b(void) {\n  return 1;\n}\n' \
    >"$l/worker/b.c"
  printf '__attribute__((visibility("default"))) int helper(void) {\n  return 2;\n}\n__attribute__((visibility("default"))) int kl__sim_mutant;\n' \
    >"$l/worker/helper.c"
  printf 'int kl__replay_run(void);\nint kl__replay_run(void) {\n  return 3;\n}\n' \
    >"$l/worker/replay.c"
  for c in lanes b helper replay; do
    "${CC:-cc}" -c -fPIC -fvisibility=hidden -I"$l/include" \
      "$l/worker/$c.c" -o "$l/$c.c.o"
  done
  "${CC:-cc}" -shared -o "$l/libkeylane.so" "$l"/*.c.o
  ar rcs "$l/libkeylane_static.a" "$l"/*.c.o
  if out=$(python3 "$HERE/check_library.py" "$l" "$l/libkeylane.so" \
    "$l/libkeylane_static.a"); then
    echo "FAILED: a library that exports kl__ names, a mutant, an undeclared name, lacks a public function and holds a tool passed: $out"
    exit 1
  fi
  names "libkeylane.so exports kl__b, an internal kl__ name: drop its KL_EXPORT" \
    "the exported kl__ name"
  names "libkeylane.so exports kl__sim_mutant, a mutant of the simulator" \
    "the exported mutant"
  names "libkeylane.so exports helper, which no header of include/keylane/ declares" \
    "the undeclared export"
  names "include/keylane/a.h declares kl_gone (KL_EXPORT), which libkeylane.so does not export" \
    "the public function the library lacks"
  names "libkeylane.so holds worker/replay.c, which nothing the public headers declare reaches" \
    "the tool in the library"
  [ "$(grep -c FAILED: <<<"$out")" = 5 ] ||
    { echo "FAILED: a public function and what it calls were refused: $out"; exit 1; }
  echo "ok: an export that is no public API, a public function not exported, and a tool in the library are refused, named"
}
library_api
