# Shared by the tests/clients drivers (sourced): paths, ok/bad, the venv
# with the Python packages from PyPI, and embedded clusters.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
BIN=${KEYLANE_BIN:-$SRC/build/bin/keylane}
BUILD=${KEYLANE_BUILD_DIR:-$SRC/build}
passed=0 failed=0
PIDS=()
# Go's default install, for a shell whose PATH lacks it
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin

ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }
# check DESCRIPTION COMMAND...: ok when COMMAND exits 0, else FAILED with
# its stderr.
check() {
  local what=$1 err
  shift
  if err=$("$@" 2>&1 >/dev/null); then ok "$what"; else bad "$what: $(echo "$err" | tail -c 600)"; fi
}

W=$(mktemp -d /tmp/keylane-clients-XXXXXX)
# On the way out only, whatever the status (see tests/kafka/test_interop.sh).
clients_cleanup() {
  set +e
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  if [ "$failed" = 0 ] && [ -z "${KEYLANE_TEST_KEEP:-}" ]; then rm -rf "$W"; else echo "kept $W"; fi
}
trap clients_cleanup EXIT

# The venv: PyPI's packages (tests/clients/requirements.txt), made once per
# build directory under a lock, since make test runs the client tests at
# once; the keylane package (clients/python) is installed anew each run, as a
# user installs it (pip install ./clients/python), into this run's own
# directory, so that one test's reinstall never pulls the package from under
# another's running Python. PY runs the venv's Python with that directory
# first on its path.
clients_venv() {
  VENV=$BUILD/venv-clients
  local req=$HERE/requirements.txt
  (
    flock 9
    if ! cmp -s "$req" "$VENV/requirements.txt" 2>/dev/null; then
      rm -rf "$VENV"
      python3 -m venv "$VENV" &&
        timeout 600 "$VENV/bin/pip" install -q --disable-pip-version-check -r "$req" &&
        cp "$req" "$VENV/requirements.txt"
    fi
  ) 9>"$BUILD/venv-clients.lock" || return 1
  # from a copy: setuptools builds in the tree it is given
  cp -r "$SRC/clients/python" "$W/python-src"
  rm -rf "$W/python-src/build" "$W/python-src/src/"*.egg-info
  timeout 300 "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation \
    --target "$W/site" "$W/python-src" >"$W/pip.log" 2>&1 || {
    cat "$W/pip.log"
    return 1
  }
  PY=$W/python
  printf '#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec %s "$@"\n' "$W/site" "$VENV/bin/python" >"$PY"
  chmod +x "$PY"
}

# delayed_case WHAT BOOTSTRAP PUBLISHER...: PUBLISHER publish-delayed
# BOOTSTRAP later NOT_BEFORE publishes key "at" with NOT_BEFORE (a day from
# now) and "in" with a 60 s delay; `keylane inspect`, the C decoder, must
# read both times back.
delayed_case() {
  local what=$1 boot=$2 nb t0 t1
  shift 2
  nb=$(($(date +%s%3N) + 86400000))
  t0=$(date +%s%3N)
  "$@" publish-delayed "$boot" later "$nb"
  t1=$(date +%s%3N)
  check "keylane inspect (the C decoder) reads the $what's delayed events: not before $nb, and 60 s after publishing" \
    delayed_read "$boot" later "$nb" "$t0" "$t1"
}

# delayed_read BOOTSTRAP TOPIC NOT_BEFORE T0 T1: TOPIC's event "at" has
# NOT_BEFORE, and "in" one 60 s after a time between T0 and T1 (ms).
delayed_read() {
  "$BIN" inspect -b "$1" -t "$2" >"$W/$2.jsonl" &&
    "$PY" -c '
import json, sys
nb, t0, t1 = (int(a) for a in sys.argv[2:5])
got = {r["key"]: r.get("not_before") for r in map(json.loads, open(sys.argv[1]))}
assert got.get("at") == nb, (got, nb)
assert t0 + 60000 <= (got.get("in") or 0) <= t1 + 60000, (got, t0, t1)
' "$W/$2.jsonl" "$3" "$4" "$5"
}

# embedded NAME TOPIC PARTITIONS: a `keylane broker --embedded` in the
# background with TOPIC of PARTITIONS (other topics are made on first use
# with 4); sets BOOT_<NAME> to its bootstrap.
embedded() {
  local file=$W/$1.bootstrap
  "$BIN" broker --embedded -t "$2" --partitions "$3" --brokers 1 \
    --bootstrap-file "$file" >"$W/$1.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do
    [ -s "$file" ] && break
    sleep 0.1
  done
  printf -v "BOOT_$1" '%s' "$(sed 's/^bootstrap=//' "$file")"
}

# ledger_wait STORE EXPECTED: waits (60 s at most) until `keylane ledger
# --json` shows EXPECTED's balances and seqs (tests/kafka/interop.py compare).
ledger_wait() {
  for _ in $(seq 1 120); do
    if "$BIN" ledger --store "$1" --json >"$W/ledger.json" 2>/dev/null &&
      "$PY" "$SRC/tests/kafka/interop.py" compare "$2" "$W/ledger.json" 2>/dev/null; then
      return 0
    fi
    sleep 0.5
  done
  "$PY" "$SRC/tests/kafka/interop.py" compare "$2" "$W/ledger.json"
  return 1
}

clients_summary() {
  echo "$1: $passed passed, $failed failed"
  [ "$failed" = 0 ]
}

# handler_case NAME COMMAND: a `keylane worker` with `--handler
# exec:COMMAND LOG MARKERS CRASH_AT` (2 children, 8 events in flight each)
# over the events of handlers.py on a cluster of its own; the child is
# killed once, at its 150th event, with events in flight. handlers.py
# verify says what must come out.
handler_case() {
  local name=$1 cmd=$2 dir=$W/handler-$1
  mkdir -p "$dir/markers"
  embedded "h$name" hevents 4
  local boot_var=BOOT_h$name
  local boot=${!boot_var}
  "$PY" "$HERE/interop_python.py" topic "$boot" hevents.dlq
  "$PY" "$HERE/handlers.py" publish "$boot" hevents "$dir/expected.json"
  "$BIN" worker -b "$boot" -t hevents -g "h$name" --store "$dir/store" \
    --handler "exec:$cmd $dir/effects.jsonl $dir/markers 150" \
    --concurrency 2 -X worker.exec.window=8 --max-attempts 5 \
    --retry-initial-ms 10 --retry-max-ms 200 --handler-timeout-ms 10000 \
    --partitions 4 --session-timeout-ms 6000 >"$dir/worker.log" 2>&1 &
  local worker=$!
  PIDS+=($worker)
  local verdict=''
  for _ in $(seq 1 90); do
    sleep 1
    [ -s "$dir/effects.jsonl" ] || continue
    if verdict=$("$PY" "$HERE/handlers.py" verify "$dir/expected.json" "$dir/effects.jsonl" \
      "$boot" hevents.dlq 2>&1); then
      break
    fi
  done
  if [ -e "$dir/markers/crash" ] && echo "$verdict" | grep -q "applied once"; then
    ok "$name handler under keylane worker, killed once mid-batch: $verdict"
  else
    bad "$name handler: ${verdict:-no effects} (crashed: $([ -e "$dir/markers/crash" ] && echo yes || echo no)); see $dir/worker.log"
  fi
  kill "$worker"
  if wait "$worker"; then ok "$name handler: the worker drained and exited 0"; else bad "$name handler: the worker exited $?"; fi
}
