#!/usr/bin/env bash
# The Python package (clients/python) against keylane itself, on embedded
# clusters (`keylane broker --embedded`):
#  - its own unit tests (pytest);
#  - for 10,000 keys, keylane.partition() and the partitions the
#    Publisher's events landed on equal `keylane route` and the partitions
#    `keylane publish` (kl_publish()) reported;
#  - keylane.envelope writes the very bytes `keylane publish` wrote for the
#    same events (msgpack width boundaries, UTF-8, headers, raw payloads,
#    delayed events), and `keylane inspect` reads the not_before of the
#    Publisher's delayed events;
#  - a `keylane worker` (ledger handler) applies what the Publisher
#    published, re-published ids once: balances and seqs exactly;
#  - a handler on keylane.handler (handler_py.py) under a `keylane worker`
#    with pipelined children: answers, retries, failures (dead letters
#    with the reason), follow-ups through emit, a child killed mid-batch.
# confluent-kafka, msgpack and pytest come from PyPI into a venv under the
# build directory, made once (tests/clients/requirements.txt).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
clients_venv
IO="$PY $HERE/interop_python.py"

# ---- 1. the package's own tests
if (cd "$SRC/clients/python" && KEYLANE_BIN=$BIN KEYLANE_REQUIRE_SPEEDUPS=1 "$PY" -m pytest -q -p no:cacheprovider tests) >"$W/pytest.log" 2>&1; then
  ok "pytest clients/python: $(tail -1 "$W/pytest.log")"
else
  tail -40 "$W/pytest.log"
  bad "pytest clients/python: $(tail -1 "$W/pytest.log")"
fi

# ---- 2. partitions, 10,000 keys
$IO keys "$W/keys" 10000 29
for n in 1 7 16 100 1000; do
  "$BIN" route --partitions $n <"$W/keys" >"$W/routed-$n.tsv"
  check "keylane.partition() equals keylane route for 10,000 keys on $n partitions" \
    $IO route "$W/keys" $n "$W/routed-$n.tsv"
done
embedded route events 16
$IO publish "$BOOT_route" events "$W/keys" "$W/py-placed.tsv"
check "the Publisher's 10,000 events landed on the partitions keylane route names" \
  cmp "$W/py-placed.tsv" "$W/routed-16.tsv"
$IO publish-lines "$W/keys" "$W/keys.jsonl"
"$BIN" publish -b "$BOOT_route" -t events -p 16 <"$W/keys.jsonl" >"$W/c-published.jsonl"
"$PY" -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print("%s\t%d" % (r["key"], r["partition"]))
' "$W/c-published.jsonl" >"$W/c-placed.tsv"
check "kl_publish() (keylane publish) put the same 10,000 keys on the same partitions" \
  cmp "$W/py-placed.tsv" "$W/c-placed.tsv"

# ---- 3. the same bytes as keylane's encoder
$IO same-bytes-lines "$W/same.jsonl"
"$BIN" publish -b "$BOOT_route" -t same <"$W/same.jsonl" >"$W/same-published.jsonl"
check "keylane.envelope encodes 11 events (2 delayed) to the bytes keylane publish wrote" \
  $IO same-bytes "$BOOT_route" same "$W/same.jsonl" "$W/same-published.jsonl"

# ---- 3b. delayed events: the C decoder reads the Publisher's not_before
delayed_case Publisher "$BOOT_route" $IO

# ---- 4. a worker applies the Publisher's events
embedded ledger ledger 6
$IO topic "$BOOT_ledger" ledger.dlq # the worker needs its dead-letter topic
$IO ledger "$BOOT_ledger" ledger py- 20 600 3 "$W/expected.json"
"$BIN" worker -b "$BOOT_ledger" -t ledger -g clients --store "$W/store" --handler ledger \
  --partitions 6 --session-timeout-ms 6000 >"$W/worker.log" 2>&1 &
WORKER=$!
PIDS+=($WORKER)
check "a keylane worker applied the Publisher's 600 events (60 re-published ids once): 20 balances and seqs exactly" \
  ledger_wait "$W/store" "$W/expected.json"
kill "$WORKER"
if wait "$WORKER"; then ok "the worker drained and exited 0"; else bad "the worker exited $?; see $W/worker.log"; fi

# ---- 5. a handler on keylane.handler, under a worker
handler_case python "$PY $HERE/handler_py.py"

clients_summary clients-python
