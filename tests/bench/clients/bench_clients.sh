#!/usr/bin/env bash
# Throughput of the Python client package, on embedded clusters:
#  1. publish: keylane.Publisher against bare confluent-kafka producing the
#     same bytes (bench_clients.py publish says how);
#  2. handle: a ledger-like exec handler on keylane.handler, and the same
#     work hand-written as today (json.loads, json.dumps, flush per event),
#     a) alone: 100,000 request lines on a pipe, answered;
#     b) under `keylane worker` (--concurrency 1, worker.exec.window 8,
#        durability none): events/s from the handler's first event to its
#        last, as keylane-bench exec times its c1 run.
# Usage: tests/bench/clients/bench_clients.sh [PUBLISH_EVENTS] [HANDLER_EVENTS] [ROUNDS] [PARTS]
# (defaults 200000, 100000, 3, "publish alone worker"). Not a test: it
# prints figures.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../../clients/lib.sh"
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bench_clients.py
PUB_N=${1:-200000}
H_N=${2:-100000}
ROUNDS=${3:-3}
PARTS=${4:-publish alone worker}
clients_venv
has() { [[ " $PARTS " == *" $1 "* ]]; }

if has publish; then
  "$PY" "$BENCH" publish "$BIN" "$PUB_N" "$ROUNDS"
fi

has alone || has worker || exit 0
echo "handle: $H_N ledger events (1,000 keys), python3 $("$PY" -c 'import sys; print(sys.version.split()[0])')"
"$PY" "$BENCH" requests "$H_N" "$W/requests.jsonl"
for kind in helper hand; do
  "$PY" "$BENCH" handler-script $kind "$W/$kind.py"
done
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
eps() { if [ -s "$1" ]; then awk -v n="$H_N" '{printf "%.0f\n", n / $1}' "$1"; else echo 0; fi; }
has alone && for kind in helper hand; do
  for r in $(seq 1 "$ROUNDS"); do
    rm -f "$W/$kind.result"
    "$PY" "$W/$kind.py" "$H_N" "$W/$kind.result" <"$W/requests.jsonl" >/dev/null
    eps "$W/$kind.result"
  done | median >"$W/$kind.alone"
done
has alone && printf '  %-52s %9s events/s\n' "alone on a pipe, keylane.handler:" "$(cat "$W/helper.alone")" \
  "alone on a pipe, hand-written:" "$(cat "$W/hand.alone")"
has worker || exit 0

embedded handle bench 16
"$PY" "$BENCH" load "$BOOT_handle" bench "$H_N"
"$PY" "$HERE/interop_python.py" topic "$BOOT_handle" bench.dlq
# interleaved, so that a change of load hits both alike
for r in $(seq 1 "$ROUNDS"); do
  for kind in ${KINDS:-helper hand}; do
    rm -f "$W/$kind.result"
    "$BIN" worker -b "$BOOT_handle" -t bench -g "bench-$kind-$r" --store "$W/store-$kind-$r" \
      --handler "exec:$PY $W/$kind.py $H_N $W/$kind.result" --durability none \
      --concurrency 1 -X worker.exec.window=8 --partitions 16 >"$W/worker-$kind-$r.log" 2>&1 &
    worker=$!
    for _ in $(seq 1 240); do
      [ -s "$W/$kind.result" ] && break
      sleep 0.5
    done
    kill "$worker"
    # SIGTERM is a graceful stop: anything but exit 0 is a failed run
    if ! wait "$worker"; then
      echo "bench_clients: the $kind worker of round $r failed; its log:" >&2
      tail -n 20 "$W/worker-$kind-$r.log" >&2
      exit 1
    fi
    eps "$W/$kind.result" >>"$W/$kind.worker-runs"
    rm -rf "$W/store-$kind-$r"
  done
done
for kind in ${KINDS:-helper hand}; do median <"$W/$kind.worker-runs" >"$W/$kind.worker"; done
printf '  %-52s %9s events/s\n' "under keylane worker (c1, window 8), keylane.handler:" "$(cat "$W/helper.worker")" \
  "under keylane worker (c1, window 8), hand-written:" "$(cat "$W/hand.worker")"
