#!/usr/bin/env bash
# The console's answers on a fleet of many partitions: an embedded
# cluster of $PARTITIONS (1000) partitions, one worker that has applied an
# event on each and holds $STUCK (100) keys retrying, and the console on
# it; prints the median time and the bytes of /api/fleet, /api/stuck and
# /api/keys/KEY over 20 requests each. Not a ctest test: run it by hand,
#   KEYLANE_BIN=build/bin/keylane KEYLANE_SOURCE_DIR=. tests/console/bench.sh
set -euo pipefail
SRC=${KEYLANE_SOURCE_DIR:?}
PARTITIONS=${PARTITIONS:-1000}
STUCK=${STUCK:-100}
. "$SRC/tests/console/fleet.sh"

start_cluster cluster
{
  for i in $(seq "$PARTITIONS"); do echo "{\"key\":\"acct-$i\",\"type\":\"t\",\"id\":\"b-$i\",\"payload\":{}}"; done
  for i in $(seq "$STUCK"); do echo "{\"key\":\"poison-$i\",\"type\":\"t\",\"id\":\"p-$i\",\"payload\":{}}"; done
} | "$BIN" publish -b "$B" -t events >/dev/null
start_worker worker
start_console console --worker "$URL"
for _ in $(seq 300); do
  total=$(curl -sf "${CONSOLE}api/stuck" | python3 -c 'import json, sys; print(json.load(sys.stdin)["total"])' || echo 0)
  [ "$total" -ge "$STUCK" ] && break
  sleep 0.2
done
echo "partitions=$PARTITIONS stuck_keys=$total"
for path in api/fleet api/stuck "api/stuck?limit=1000" api/keys/poison-1; do
  for _ in $(seq 20); do curl -s -o /dev/null -w '%{time_total} %{size_download}\n' "$CONSOLE$path"; done |
    sort -n | awk -v p="/$path" 'NR == 10 { printf "%-22s median %.1f ms, %d bytes\n", p, $1 * 1000, $2 }'
done
