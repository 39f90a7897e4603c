#!/usr/bin/env bash
# One ledger topic fed by every client at once: `keylane publish` (C,
# kl_publish()), the Python Publisher, the Go Publisher and the HTTP
# gateway, each re-publishing some of its own ids; then Python and the
# gateway re-publish ids the others had published. A `keylane worker`
# (ledger handler) must show exactly the balances and seqs of each event
# applied once, with no order violation (mixed.py).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
clients_venv
export GOFLAGS="${GOFLAGS:-} -mod=mod"
(cd "$HERE/go" && timeout 600 go build -o "$W/clients-go" .)

embedded mixed ledger 8
"$PY" "$HERE/interop_python.py" topic "$BOOT_mixed" ledger.dlq
"$BIN" broker --listen 127.0.0.1:0 -b "$BOOT_mixed" >"$W/gateway.out" 2>"$W/gateway.log" &
PIDS+=($!)
for _ in $(seq 1 100); do
  grep -q '^listening=' "$W/gateway.out" 2>/dev/null && break
  sleep 0.1
done
GATEWAY=$(sed -n 's/^listening=//p' "$W/gateway.out")
"$BIN" worker -b "$BOOT_mixed" -t ledger -g mixed --store "$W/store" --handler ledger \
  --partitions 8 --session-timeout-ms 6000 >"$W/worker.log" 2>&1 &
WORKER=$!
PIDS+=($WORKER)

if said=$("$PY" "$HERE/mixed.py" run "$BIN" "$BOOT_mixed" "$GATEWAY" "$W/clients-go" ledger "$W" 2>&1); then
  ok "$said"
else
  bad "publishing: $said"
fi
check "a keylane worker applied C, Python, Go and gateway events once each, re-published ids too: 40 balances and seqs exactly, 0 order violations" \
  ledger_wait "$W/store" "$W/expected.json"
kill "$WORKER"
if wait "$WORKER"; then ok "the worker drained and exited 0"; else bad "the worker exited $?; see $W/worker.log"; fi

clients_summary clients-mixed
