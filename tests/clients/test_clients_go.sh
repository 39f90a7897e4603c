#!/usr/bin/env bash
# The Go module (clients/go) against keylane itself, on embedded clusters
# (`keylane broker --embedded`):
#  - its own unit tests (go test ./...);
#  - for 10,000 keys, keylane.Partition() and the partitions the
#    Publisher's events landed on equal `keylane route`;
#  - keylane.CheckEvent writes the very bytes `keylane publish` wrote for
#    the same events (delayed ones too), and `keylane inspect` reads the
#    NotBefore of the Publisher's delayed events;
#  - a `keylane worker` (ledger handler) applies what the Publisher
#    published, re-published ids once: balances and seqs exactly;
#  - a handler on the handler package under a `keylane worker` with
#    pipelined children: retries, failures (dead letters with the
#    reason), follow-ups through Emit, a child killed mid-batch.
# Go modules come from the module proxy (go.sum pins them); the events and
# verdicts of the handler test are Python's (handlers.py), from the venv
# test_clients_python.sh uses.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
clients_venv
IO="$PY $HERE/interop_python.py"
export GOFLAGS="${GOFLAGS:-} -mod=mod"

# ---- 1. the module's own tests, and the test program
if (cd "$SRC/clients/go" && KEYLANE_BIN=$BIN timeout 600 go test -count=1 ./...) >"$W/gotest.log" 2>&1; then
  ok "go test clients/go: $(grep -c '^ok' "$W/gotest.log") packages ok"
else
  tail -40 "$W/gotest.log"
  bad "go test clients/go: $(grep -v '^ok' "$W/gotest.log" | tail -1)"
fi
(cd "$HERE/go" && timeout 600 go build -o "$W/clients-go" .)
GO=$W/clients-go

# ---- 2. partitions, 10,000 keys
$IO keys "$W/keys" 10000 29
for n in 1 7 16 100 1000; do
  "$BIN" route --partitions $n <"$W/keys" >"$W/routed-$n.tsv"
  $GO route $n <"$W/keys" >"$W/go-routed-$n.tsv"
  check "keylane.Partition() equals keylane route for 10,000 keys on $n partitions" \
    cmp "$W/go-routed-$n.tsv" "$W/routed-$n.tsv"
done
embedded route events 16
$GO publish "$BOOT_route" events "$W/keys" "$W/go-placed.tsv"
check "the Go Publisher's 10,000 events landed on the partitions keylane route names" \
  cmp "$W/go-placed.tsv" "$W/routed-16.tsv"

# ---- 3. the same bytes as keylane's encoder
$IO same-bytes-lines "$W/same.jsonl"
"$BIN" publish -b "$BOOT_route" -t same <"$W/same.jsonl" >"$W/same-published.jsonl"
check "keylane.CheckEvent encodes 11 events (2 delayed) to the bytes keylane publish wrote" \
  $GO same-bytes "$BOOT_route" same "$W/same.jsonl" "$W/same-published.jsonl"

# ---- 3b. delayed events: the C decoder reads the Go Publisher's NotBefore
delayed_case "Go Publisher" "$BOOT_route" $GO

# ---- 4. a worker applies the Go Publisher's events
embedded ledger ledger 6
$IO topic "$BOOT_ledger" ledger.dlq
$GO ledger "$BOOT_ledger" ledger go- 20 600 3 "$W/expected.json"
"$BIN" worker -b "$BOOT_ledger" -t ledger -g clients --store "$W/store" --handler ledger \
  --partitions 6 --session-timeout-ms 6000 >"$W/worker.log" 2>&1 &
WORKER=$!
PIDS+=($WORKER)
check "a keylane worker applied the Go Publisher's 600 events (60 re-published ids once): 20 balances and seqs exactly" \
  ledger_wait "$W/store" "$W/expected.json"
kill "$WORKER"
if wait "$WORKER"; then ok "the worker drained and exited 0"; else bad "the worker exited $?; see $W/worker.log"; fi

# ---- 5. a handler on the handler package, under a worker
handler_case go "$GO handler"

clients_summary clients-go
