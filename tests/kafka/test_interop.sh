#!/usr/bin/env bash
# Interop with clients nobody here wrote, on KEYLANE_TEST_BOOTSTRAP's Kafka:
#  - kcat (librdkafka's murmur2_random partitioner) publishes msgpack
#    envelopes that Python's msgpack built; kafka-python (its own pure
#    Python, Java-compatible partitioner) publishes more;
#  - each key lands on the partition `keylane route` names, and a
#    `keylane worker` applies them all: `keylane ledger --json` shows the
#    balances and seqs the Python side computed;
#  - what `keylane publish` publishes is read back, at the partitions and
#    offsets it reported, by kcat (each value a valid envelope with the id
#    keylane reported) and by Kafka's own ConsoleConsumer, which must
#    also exit 0 (console_check.sh).
# Python packages come from PyPI into a venv under the build directory,
# made once (tests/kafka/requirements.txt).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
BIN=${KEYLANE_BIN:-$SRC/build/bin/keylane}
BUILD=${KEYLANE_BUILD_DIR:-$SRC/build}
B=${KEYLANE_TEST_BOOTSTRAP:?set KEYLANE_TEST_BOOTSTRAP to a Kafka cluster}
RF=${KEYLANE_TEST_RF:-1}
KAFKA_SH=$SRC/deploy/kafka/kafka.sh
PARTS=6
passed=0 failed=0

ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }
. "$HERE/console_check.sh"

W=$(mktemp -d /tmp/keylane-interop-XXXXXX)
WORKER=''
# On the way out only, whatever the status: a worker already gone must not
# stop the rest (set -e), and the script's status is its checks' (an EXIT
# trap that does not call exit leaves it as it was).
cleanup() {
  set +e
  [ -z "$WORKER" ] || kill "$WORKER" 2>/dev/null
  wait 2>/dev/null
  if [ "$failed" = 0 ] && [ -z "${KEYLANE_TEST_KEEP:-}" ]; then rm -rf "$W"; else echo "kept $W"; fi
}
trap cleanup EXIT

# ---- the Python side, from PyPI, once per build directory
VENV=$BUILD/venv-tests
REQ=$HERE/requirements.txt
if ! cmp -s "$REQ" "$VENV/requirements.txt" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ"
  cp "$REQ" "$VENV/requirements.txt"
fi
PY="$VENV/bin/python $HERE/interop.py"

run=$(date +%s)-$$
IN=interop-in-$run OUT=interop-out-$run
# The worker refuses to start without its dead-letter topic.
$PY create-topic "$B" "$IN" $PARTS "$RF"
$PY create-topic "$B" "$IN.dlq" 1 "$RF"
$PY create-topic "$B" "$OUT" $PARTS "$RF"

# ---- 1. kcat publishes envelopes built by Python's msgpack: one file per
# message, one kcat run per key, in seq order.
$PY envelopes "$W/kcat" kcat- 10 200 1
for dir in "$W"/kcat/kcat-*/; do
  key=$(basename "$dir")
  kcat -P -b "$B" -t "$IN" -k "$key" -X partitioner=murmur2_random \
    -X acks=all -X enable.idempotence=true "$dir"*.bin
done
# ---- 2. kafka-python publishes with its own partitioner.
$PY produce "$B" "$IN" "$W/py" py- 10 200 2

# ---- 3. every key on the partition keylane routes it to
timeout 60 kcat -C -b "$B" -t "$IN" -e -q -f '%k\t%p\n' | sort -u >"$W/placed.tsv"
cut -f1 "$W/placed.tsv" | sort -u >"$W/keys"
"$BIN" route --partitions $PARTS <"$W/keys" | sort -u >"$W/routed.tsv"
n_keys=$(wc -l <"$W/keys")
if [ "$n_keys" -eq 20 ] && [ "$(wc -l <"$W/placed.tsv")" -eq 20 ] && cmp -s "$W/placed.tsv" "$W/routed.tsv"; then
  ok "kcat and kafka-python put all $n_keys keys on the partitions keylane route names"
else
  bad "partitions differ (key, partition): $(diff "$W/placed.tsv" "$W/routed.tsv" | head -5 | tr '\n' ' ')"
fi
# kafka-python's own acknowledgements say the same.
cut -f1,2 "$W/py/placed.tsv" | sort -u >"$W/py/acked.tsv"
if grep -q . <(comm -23 "$W/py/acked.tsv" "$W/routed.tsv"); then
  bad "kafka-python acknowledged keys on other partitions than keylane route"
else
  ok "kafka-python's acknowledged partitions agree with keylane route"
fi

# ---- 4. a keylane worker applies every event
"$BIN" worker -b "$B" -t "$IN" -g "interop-$run" --store "$W/store" \
  --handler ledger --partitions $PARTS --session-timeout-ms 6000 >"$W/worker.log" 2>&1 &
WORKER=$!
$PY merge "$W/expected.json" "$W/kcat/expected.json" "$W/py/expected.json"
applied=0
for _ in $(seq 1 120); do
  if "$BIN" ledger --store "$W/store" --json >"$W/ledger.json" 2>/dev/null &&
    $PY compare "$W/expected.json" "$W/ledger.json" 2>/dev/null; then
    applied=1
    break
  fi
  sleep 0.5
done
if [ $applied = 1 ]; then
  ok "the worker applied all 400 events: 20 balances and seqs as the Python side computed, 0 order violations"
else
  bad "ledger differs: $($PY compare "$W/expected.json" "$W/ledger.json" 2>&1 | head -c 400)"
fi
kill "$WORKER"
wait "$WORKER" && ok "the worker drained and exited 0" || bad "the worker exited $?; see $W/worker.log"
WORKER=''

# ---- 5. keylane publish, read back by kcat and by Kafka's ConsoleConsumer
for i in $(seq 1 30); do
  printf '{"key":"pub-%02d","type":"credit","payload":{"amount":%d,"seq":1}}\n' "$i" "$i"
done >"$W/in.jsonl"
"$BIN" publish -b "$B" -t "$OUT" -p $PARTS <"$W/in.jsonl" >"$W/published.jsonl"
$VENV/bin/python -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print("%s\t%d\t%d\t%s" % (r["key"], r["partition"], r["offset"], r["id"]))
' "$W/published.jsonl" | sort >"$W/published.tsv"
cut -f1-3 "$W/published.tsv" >"$W/want.tsv"

timeout 60 kcat -C -b "$B" -t "$OUT" -e -q -f '%k\t%p\t%o\n' | sort >"$W/kcat.tsv"
if [ "$(wc -l <"$W/want.tsv")" -eq 30 ] && cmp -s "$W/want.tsv" "$W/kcat.tsv"; then
  ok "kcat read back all 30 events keylane published, at the partitions and offsets it reported"
else
  bad "kcat read back other events: $(diff "$W/want.tsv" "$W/kcat.tsv" | head -5 | tr '\n' ' ')"
fi
envelopes_ok=1
while IFS=$'\t' read -r key p o id; do
  timeout 30 kcat -C -b "$B" -t "$OUT" -p "$p" -o "$o" -c 1 -e -q -f '%s' >"$W/value.bin"
  $PY check-envelope "$W/value.bin" "$id" || envelopes_ok=0
done <"$W/published.tsv"
[ $envelopes_ok = 1 ] && ok "each value kcat read is a v1 msgpack envelope with the id keylane reported" ||
  bad "some values are not the envelopes keylane reported"

console_status=0
timeout 120 "$KAFKA_SH" console-consumer --bootstrap-server "$B" --topic "$OUT" \
  --from-beginning --max-messages 30 --timeout-ms 30000 \
  --property print.key=true --property print.partition=true \
  --property print.offset=true --property print.value=false \
  --property key.separator=$'\t' 2>"$W/console.err" >"$W/console.out" || console_status=$?
console_check "$W/want.tsv" "$W/console.out" "$W/console.err" "$console_status"

echo "interop: $passed passed, $failed failed"
[ "$failed" = 0 ]
