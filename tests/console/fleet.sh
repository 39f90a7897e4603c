# Sourced by the console's tests (tests/mock/test_console_*.sh): the
# pieces of a fleet on embedded clusters, each ended by the EXIT trap,
# also when the test fails. start_fleet is the usual one: two workers
# whose exec handler asks to retry every event of a key "poison*" (so the
# key stays retrying, with the handler's error) and fails for good every
# event of a key "dead*" until the file $W/fixed exists (a dead letter,
# then the fix a redrive applies), and a console on both.
set -euo pipefail
BIN=${KEYLANE_BIN:?}
W=$(mktemp -d /tmp/keylane-console-XXXXXX)
pids=()
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*" >&2
  for f in "$W"/*.log; do echo "--- $f" >&2; grep -v dbus "$f" | tail -n 15 >&2; done
  exit 1
}
# Waits up to 15 s for PATTERN in FILE; prints the first match's group.
wait_for() {
  for _ in $(seq 150); do
    v=$(sed -n "s|$2|\\1|p" "$1" | head -n 1)
    [ -n "$v" ] && { echo "$v"; return 0; }
    sleep 0.1
  done
  return 1
}

cat >"$W/handler.py" <<PY
import json, os, sys
FIXED = "$W/fixed"
for line in sys.stdin:
    req = json.loads(line)
    if req.get("key", "").startswith("dead") and not os.path.exists(FIXED):
        ans = {"seq": req["seq"], "status": "fail",
               "error": "dead key refused by the test handler"}
    elif req.get("key", "").startswith("poison"):
        ans = {"seq": req["seq"], "status": "retry",
               "error": "poison key refused by the test handler"}
    else:
        ans = {"seq": req["seq"], "status": "ok"}
    print(json.dumps(ans), flush=True)
PY

# NAME: an embedded cluster of $PARTITIONS (4) partitions of topic events;
# sets B and CLUSTER (its pid).
start_cluster() {
  "$BIN" broker --embedded --partitions "${PARTITIONS:-4}" -t events >"$W/$1.out" 2>"$W/$1.log" &
  CLUSTER=$!
  pids+=($CLUSTER)
  B=$(wait_for "$W/$1.out" '^bootstrap=\(.*\)') || fail "the embedded cluster did not start"
}

# NAME [WORKER-OPTION...]: a worker of group console on $W/store with
# --metrics-listen (the options after the defaults, which they override);
# sets WORKER (its pid) and URL (its API). The session timeout is 4 s:
# librdkafka's mock group coordinator (2.0.2, and still today) answers a
# member's SyncGroup that reaches it after the leader's with "Invalid
# request", so that member joins again, and each such round of a
# rebalance waits the session timeout less 1 s; under load two workers
# took over 30 s to settle with the default 10 s.
start_worker() {
  local name=$1
  shift
  "$BIN" worker -b "$B" -t events -g console --store "$W/store" \
    --handler "exec:python3 $W/handler.py" --metrics-listen 127.0.0.1:0 \
    -X worker.max.attempts=1000 -X worker.retry.initial.ms=50 \
    -X worker.retry.max.ms=200 -X worker.session.timeout.ms=4000 "$@" >"$W/$name.log" 2>&1 &
  WORKER=$!
  pids+=($WORKER)
  local port
  port=$(wait_for "$W/$name.log" '.*serving /metrics.*(port \([0-9]*\)).*') || fail "$name has no metrics port"
  URL=http://127.0.0.1:$port
}

# NAME CONSOLE-OPTION...: the console on a free port; sets CONSOLE.
start_console() {
  local name=$1
  shift
  "$BIN" console -b "$B" -t events -g console --store "$W/store" \
    --listen 127.0.0.1:0 "$@" >"$W/$name.out" 2>"$W/$name.log" &
  pids+=($!)
  CONSOLE=$(wait_for "$W/$name.out" '^console=\(.*\)') || fail "the console did not start"
}

# Sets B, W1 and W2 (the workers' URLs) and CONSOLE (the page's URL).
start_fleet() {
  start_cluster cluster
  {
    for i in 1 2 3 4 5 6; do echo "{\"key\":\"acct-$i\",\"type\":\"t\",\"id\":\"c-$i\",\"payload\":{}}"; done
    echo '{"key":"poison-1","type":"t","id":"c-poison","payload":{}}'
    echo '{"key":"dead-2","type":"t","id":"c-dead","payload":{"n":1}}'
  } | "$BIN" publish -b "$B" -t events >/dev/null
  start_worker worker1
  W1=$URL
  start_worker worker2
  W2=$URL
  start_console console --worker "$W1" --worker "$W2"
}

# URL CHROMIUM-OPTION...: Debian's chromium, headless, on URL, 45 s at
# most; the page's scripts get 3 s of virtual time. Its own temporary files
# (a singleton socket it leaves behind) go to $W, removed at the end.
browse() {
  local url=$1
  shift
  TMPDIR="$W" timeout 45 chromium --headless=new --no-sandbox --disable-gpu \
    --no-first-run --disable-dev-shm-usage --user-data-dir="$W/chrome" \
    --virtual-time-budget=3000 --window-size=1280,900 "$@" "$url" \
    2>>"$W/chromium.log"
}
need_chromium() {
  command -v chromium >/dev/null ||
    fail "no chromium: make test-deps installs it (deploy/install-deps.sh --test)"
}
