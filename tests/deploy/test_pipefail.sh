#!/usr/bin/env bash
# Under `set -o pipefail`, `cmd | grep -q x` is false now and then although
# cmd printed x: grep exits at the first match, and a cmd still writing
# dies of SIGPIPE, which pipefail makes the pipeline's status. test_make.sh
# failed that way once in CI's run of make test (make -n was still
# printing). Scripts that set pipefail must feed grep -q another way
# (`grep -q x <(cmd)`, or a variable). A `bash -c` child does not inherit
# pipefail, so such lines are not counted.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
cd "$SRC"

# The mistake itself, shown: cmd prints the match first, then more.
# (seq's writes after grep exited end in SIGPIPE.)
lost=0
for _ in 1 2 3 4 5 6 7 8 9 10; do
  if ! seq 1 200000 | grep -q '^1$'; then lost=$((lost + 1)); fi
done
echo "seq | grep -q under pipefail: false in $lost of 10 runs"
[ "$lost" -gt 0 ] || { echo "FAILED: the demonstration did not fail once"; exit 1; }

found=$(grep -lZ -e pipefail .ci/run $(find deploy tests -name '*.sh' \
  ! -name "$(basename "$0")") |
  xargs -0 awk '/\|[[:space:]]*grep[[:space:]]+-[A-Za-z]*q/ && !/bash -c/ &&
    !/^[[:space:]]*#/ {
    print FILENAME ":" FNR ": " $0 }')
if [ -n "$found" ]; then
  echo "FAILED: grep -q at the end of a pipeline, in scripts with pipefail:"
  echo "$found"
  exit 1
fi
echo "ok: no script with pipefail pipes into grep -q"
