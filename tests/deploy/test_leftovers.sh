#!/usr/bin/env bash
# make test's last step, tests/support/leftovers.sh: a process of a build
# directory that outlived its test fails the run and is ended; a clean run
# passes; a process elsewhere is not touched.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
T=$(mktemp -d /tmp/keylane-leftovers-XXXXXX)
pids=()
cleanup() {
  [ ${#pids[@]} -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
passed=0 failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }
mkdir -p "$T/build/bin" "$T/other"
cp "$(command -v sleep)" "$T/build/bin/keylane"
cp "$(command -v sleep)" "$T/other/sleep"

rc=0
"$SRC/tests/support/leftovers.sh" "$T/build" >"$T/clean.log" 2>&1 || rc=$?
[ $rc = 0 ] && ok "nothing left: exit 0" || bad "nothing left, exit $rc: $(cat "$T/clean.log")"

# one left in its own session, as a test's background process would be, and
# one whose command line names the directory (a fixture's server)
setsid "$T/build/bin/keylane" 300 &
pids+=($!)
setsid python3 -c "import time; time.sleep(301)" "$T/build/data" &
pids+=($!)
setsid "$T/other/sleep" 302 &
pids+=($!)
sleep 0.2
rc=0
"$SRC/tests/support/leftovers.sh" "$T/build" >"$T/left.log" 2>&1 || rc=$?
[ $rc = 1 ] && ok "left running: exit 1" || bad "left running, exit $rc"
grep -q "pid ${pids[0]} outlived its test: $T/build/bin/keylane 300" "$T/left.log" &&
  ok "the leftover is named with its command line" || bad "not named: $(cat "$T/left.log")"
grep -q "pid ${pids[1]} outlived" "$T/left.log" &&
  ok "a process naming the directory is found" || bad "not found: $(cat "$T/left.log")"
for _ in $(seq 50); do kill -0 "${pids[0]}" 2>/dev/null || break; sleep 0.1; done
wait "${pids[0]}" 2>/dev/null || true
kill -0 "${pids[0]}" 2>/dev/null && bad "the leftover still runs" || ok "the leftover was ended"
kill -0 "${pids[2]}" 2>/dev/null && ok "a process elsewhere is left alone" || bad "a process elsewhere was ended"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
