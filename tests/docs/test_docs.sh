#!/usr/bin/env bash
# The docs are a manual whose commands run: every shell block of README.md
# and docs/*.md is run by prysk (a maintained fork of cram) through
# docs_to_t.py, and what a ```console block shows is what it must print.
# docs/*.md pages find an embedded cluster in $B (topic events, 8
# partitions) and a store with one applied event in $STORE; README.md starts
# its own, as a reader does. Also: every path and kl_ function the pages
# name exists. prysk comes from PyPI into a venv under the build directory,
# made once (requirements.txt).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
BIN=${KEYLANE_BIN:-$SRC/build/bin/keylane}
BUILD=${KEYLANE_BUILD_DIR:-$SRC/build}
VENV=$BUILD/docs-venv
W=$(mktemp -d /tmp/keylane-docs-XXXXXX)
GROUP=''
cleanup() {
  set +e
  [ -z "$GROUP" ] || kill -- "-$GROUP" 2>/dev/null
  jobs -p | xargs -r kill 2>/dev/null
  wait 2>/dev/null
  if [ -z "${KEYLANE_TEST_KEEP:-}" ]; then rm -rf "$W"; else echo "kept $W"; fi
}
trap cleanup EXIT

if [ ! -x "$VENV/bin/prysk" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$HERE/requirements.txt"
fi

# The cluster and store the docs/ pages use.
PATH=$(dirname "$BIN"):$PATH
export PATH
"$BIN" broker --embedded --partitions 8 -t events >"$W/cluster.out" 2>"$W/cluster.log" &
for _ in $(seq 100); do grep -q bootstrap= "$W/cluster.out" && break; sleep 0.1; done
B=$(sed -n 's/^bootstrap=//p' "$W/cluster.out")
[ -n "$B" ] || { echo "FAILED: the embedded cluster did not start: $(cat "$W/cluster.log")"; exit 1; }
STORE=$W/store
echo '{"key":"acct-1","type":"credit","id":"docs-1","payload":{"amount":1,"seq":1}}' |
  "$BIN" publish -b "$B" -t events >/dev/null
"$BIN" worker -b "$B" -t events -g docs --store "$STORE" --handler ledger >"$W/worker.log" 2>&1 &
WP=$!
for _ in $(seq 150); do "$BIN" ledger --store "$STORE" 2>/dev/null | grep acct-1 >/dev/null && break; sleep 0.2; done
kill -TERM "$WP"; wait "$WP" || { echo "FAILED: the docs' worker: $(tail "$W/worker.log")"; exit 1; }
cat >"$W/env.sh" <<ENV
export PATH='$PATH' B='$B' STORE='$STORE'
ENV

python3 "$HERE/docs_to_t.py" "$SRC" "$W/t" >"$W/counts.json"
read -r pages < <(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["pages"]))' "$W/counts.json")
status=0
# Its own process group, so that what the pages start in the background
# goes when it ends.
KEYLANE_DOCS_ENV=$W/env.sh setsid timeout 600 "$VENV/bin/prysk" --shell=/bin/bash $pages >"$W/prysk.out" 2>&1 &
GROUP=$!
wait "$GROUP" || status=$?
cat "$W/prysk.out"
# A page stops what it starts, as a reader's terminal would be left clean:
# a process of the group still running now is a failure, then ended.
left=$(pgrep -g "$GROUP" -a || true)
if [ -n "$left" ]; then
  echo "FAILED: the pages left these running (stop them in the page):"
  echo "$left"
  kill -KILL -- "-$GROUP" 2>/dev/null
  status=1
fi
GROUP=
if [ "$status" != 0 ]; then
  for out in "$W"/t/blocks/*.out; do
    [ -s "$out" ] || continue
    echo "--- output of $(head -1 "${out%.out}.sh") ---"
    tail -n 20 "$out"
  done
fi
python3 - "$W/counts.json" "$status" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
status = int(sys.argv[2])
for e in c["errors"]:
    print("FAILED: " + e)
for s in c["skipped"]:
    print("not run here: " + s)
for s in c["run_elsewhere"]:
    print("run by another test: " + s)
print("docs: %d blocks run (%d transcripts checked line by line), %d not "
      "runnable here, %d run by other tests; %d paths and %d functions "
      "named, %d missing; prysk %s"
      % (c["run"], c["console"], len(c["skipped"]), len(c["run_elsewhere"]),
         c["paths"], c["functions"], len(c["errors"]),
         "passed" if status == 0 else "FAILED (exit %d)" % status))
sys.exit(1 if c["errors"] or status else 0)
PY
