#!/usr/bin/env bash
# The README's first command, as a new user runs it: `make demo`, and the
# same demo with --json as a script reads it. Each run must verify: every
# balance and the total, at least one batch of the paused worker rejected
# by the epoch check (the failure the demo exists to show), all three
# workers exited cleanly, and every scheduled transfer settled once, none
# before its time (looked at while the workers applied), nothing held.
set -euo pipefail
SRC=${KEYLANE_SOURCE_DIR:?}
BUILD=${KEYLANE_BUILD_DIR:?}
BIN=${KEYLANE_BIN:?}
T=$(mktemp -d /tmp/keylane-test-demo-XXXXXX)
pids=()
# A demo still running when the test ends (a signal, ctest's timeout) is
# ended with it: each runs in a session of its own, whose every process
# (make, keylane demo, its workers) is sent SIGKILL.
trap 'for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done; wait; rm -rf "$T"' EXIT
failed=0
bad() { echo "FAILED: $*" >&2; failed=1; }

# The two runs at once: each has its own embedded cluster on ports it
# picks and its own store directory, and each spends most of its time
# waiting on its paced publisher and its workers' rebalances.
setsid make -s -C "$SRC" demo BUILD="$BUILD" >"$T/make.out" 2>"$T/make.err" &
pids+=($!)
setsid "$BIN" demo --json >"$T/demo.json" 2>"$T/demo.err" &
pids+=($!)
make_rc=0 json_rc=0
wait "${pids[0]}" || make_rc=$?
wait "${pids[1]}" || json_rc=$?
pids=()

# ---- make demo, as the README says (the build is already made: make only
# checks it)
if [ "$make_rc" -eq 0 ]; then
  echo "ok: make demo exited 0"
else
  bad "make demo exited $make_rc: $(tail -n 20 "$T/make.err")"
fi
text=$(cat "$T/make.out")
grep -q '^OK: every balance verifies' <<<"$text" ||
  bad "make demo did not print 'OK: every balance verifies': $text"
fenced=$(sed -n 's/.*was fenced: \([0-9]*\) batch.*/\1/p' <<<"$text")
[ "${fenced:-0}" -ge 1 ] ||
  bad "make demo: the paused worker was not fenced (${fenced:-no figure}): $text"
grep -q '3 of 3 workers drained and exited cleanly' <<<"$text" ||
  bad "make demo: not every worker exited cleanly: $text"
sched='^scheduled transfers: \([0-9]*\) of them .*; \([0-9]*\) of \([0-9]*\) settles applied, \([0-9]*\) before their time in \([0-9]*\) looks; held at the end \(-*[0-9]*\)$'
read -r n applied due early looks held < <(sed -n "s/$sched/\1 \2 \3 \4 \5 \6/p" <<<"$text") || true
[ "${n:-0}" -ge 1 ] && [ "${applied:-}" = "$n" ] && [ "${due:-}" = "$n" ] &&
  [ "${early:-}" = 0 ] && [ "${looks:-0}" -ge 1 ] && [ "${held:-}" = 0 ] ||
  bad "make demo: the scheduled transfers did not each settle once, on time: $text"

# ---- keylane demo --json
if [ "$json_rc" -eq 0 ]; then
  echo "ok: keylane demo --json exited 0"
else
  bad "keylane demo --json exited $json_rc: $(tail -n 20 "$T/demo.err")"
fi
if python3 - "$T/demo.json" <<'PY'; then
import json, sys
d = json.load(open(sys.argv[1]))
want = {
    "ok": d.get("ok") is True,
    "fenced_batches >= 1": d.get("fenced_batches", 0) >= 1,
    "balances_ok": d.get("balances_ok") is True,
    "total_ok": d.get("total_ok") is True,
    "3 of 3 workers exited cleanly": d.get("workers_exited_cleanly") == 3,
}
s = d.get("scheduled", {})
want.update({
    "scheduled transfers >= 1": s.get("transfers", 0) >= 1,
    "one settle per scheduled transfer, each applied":
        s.get("delayed") == s.get("transfers") == s.get("delayed_applied"),
    "no settle before its time": s.get("early") == 0 and s.get("due_checks", 0) >= 1,
    "nothing held at the end": s.get("held") == 0,
})
missed = [k for k, v in want.items() if not v]
if missed:
    print("keylane demo --json: not", ", ".join(missed), ":", json.dumps(d),
          file=sys.stderr)
    sys.exit(1)
print("ok: keylane demo --json verifies:", json.dumps(d))
PY
  :
else
  failed=1
fi
exit $failed
