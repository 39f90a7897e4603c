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
