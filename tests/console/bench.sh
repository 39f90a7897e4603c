#!/usr/bin/env bash
# The console's answers on a big fleet: an embedded cluster of
# $PARTITIONS (1000) partitions, two workers that have applied an event on
# each partition and hold $STUCK (100000) keys waiting to retry (their
# next attempt an hour away, so the handler runs each once), $DEAD (1000)
# dead letters, $TIMERS (100000) timers pending (delayed events of 1,000
# keys, due in a day), and the console on both workers; prints, for each
# of its pages and JSON endpoints, the median time to build the answer (curl's
# total time, on this host) and its bytes, over 10 requests each. A
# benchmark, not a ctest test; run it by hand:
#   KEYLANE_BIN=build/bin/keylane KEYLANE_SOURCE_DIR=. tests/console/bench.sh
set -euo pipefail
SRC=${KEYLANE_SOURCE_DIR:?}
PARTITIONS=${PARTITIONS:-1000}
STUCK=${STUCK:-100000}
DEAD=${DEAD:-1000}
TIMERS=${TIMERS:-100000}
. "$SRC/tests/console/fleet.sh"

start_cluster cluster
start=$(date +%s)
{
  for i in $(seq "$PARTITIONS"); do echo "{\"key\":\"acct-$i\",\"type\":\"t\",\"id\":\"b-$i\",\"payload\":{}}"; done
  for i in $(seq "$STUCK"); do echo "{\"key\":\"poison-$i\",\"type\":\"t\",\"id\":\"p-$i\",\"payload\":{}}"; done
  for i in $(seq "$DEAD"); do echo "{\"key\":\"dead-$i\",\"type\":\"t\",\"id\":\"d-$i\",\"payload\":{\"n\":$i}}"; done
  due=$(($(date +%s) * 1000 + 86400000))
  for i in $(seq "$TIMERS"); do echo "{\"key\":\"later-$((i % 1000))\",\"type\":\"t\",\"id\":\"t-$i\",\"not_before\":$((due + i))}"; done
} | "$BIN" publish -b "$B" -t events >/dev/null
RETRY="-X worker.retry.initial.ms=3600000 -X worker.retry.max.ms=3600000 -X worker.waiting.max=200000"
# shellcheck disable=SC2086 # RETRY is two options
start_worker worker1 $RETRY
W1=$URL
# shellcheck disable=SC2086
start_worker worker2 $RETRY
W2=$URL
TOKEN=console-bench-token-0123456789
KEYLANE_CONSOLE_TOKEN=$TOKEN start_console console --worker "$W1" --worker "$W2"
AUTH="Authorization: Bearer $TOKEN"
total=0
for _ in $(seq 900); do
  total=$(curl -sf -H "$AUTH" "${CONSOLE}api/stuck?limit=1" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["total"])' || echo 0)
  [ "$total" -ge "$STUCK" ] && break
  sleep 1
done
# the workers' timers_scheduled, summed: every delayed event kept
for _ in $(seq 900); do
  scheduled=$(curl -sf "$W1/metrics" "$W2/metrics" |
    awk '/^keylane_worker_timers_scheduled_total / { n += $2 } END { print n + 0 }')
  [ "$scheduled" -ge "$TIMERS" ] && break
  sleep 1
done
letters=$(curl -sf -H "$AUTH" "${CONSOLE}api/letters?limit=1")
ref=$(python3 -c 'import json, sys; l = json.loads(sys.argv[1])["letters"][0]; print(l["dlq_partition"], l["dlq_offset"], sep="/")' "$letters")
echo "partitions=$PARTITIONS waiting_keys=$total dead_letters=$DEAD timers=$scheduled workers=2 (ready in $(($(date +%s) - start)) s)"
for path in "" api/fleet api/stuck "api/stuck?limit=1000" api/keys/poison-1 \
  api/letters "api/letters?limit=500" "api/letters?key=dead-7" "api/letters/$ref" \
  api/outbox api/fencing api/timers "api/timers?limit=1000" \
  "api/timers?key=later-7" "api/timers?key=later-7&partition=$("$BIN" route --partitions "$PARTITIONS" later-7 | cut -f2)" \
  api/keys/later-7; do
  for _ in $(seq 10); do
    curl -s -o /dev/null -H "$AUTH" -w '%{time_total} %{size_download} %{http_code}\n' "$CONSOLE$path"
  done | sort -n | awk -v p="/$path" 'NR == 5 { printf "%-24s median %7.1f ms, %8d bytes (HTTP %d)\n", p, $1 * 1000, $2, $3 }'
done
