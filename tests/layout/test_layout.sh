#!/usr/bin/env bash
# The layout's include rule (check_includes.py) on the tree, and on a copy
# of one folder pair with an include against the rule, which it must name.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
T=$(mktemp -d /tmp/keylane-layout-XXXXXX)
trap 'rm -rf "$T"' EXIT
python3 "$HERE/check_includes.py" "$SRC"
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
