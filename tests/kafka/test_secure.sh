#!/usr/bin/env bash
# keylane on a secured Kafka, the real one of the kafka suite started with
# --secure (deploy/kafka/kafka.sh: a SASL_SSL listener with SCRAM-SHA-512
# and PLAIN users, a mutual-TLS listener, a CA of its own):
#  - publish, a fleet of two workers and replay over SASL_SSL (PLAIN),
#    every setting from a --config file whose user comes from ${ENV} and
#    whose password from @file; the ledger is exact;
#  - publish over mutual TLS; SCRAM-SHA-512 publishes, or, with a
#    librdkafka before 2.6.1 (Debian 12 has 2.0.2), which cannot
#    authenticate with SCRAM to Kafka 4 brokers, fails at once saying so;
#  - a wrong password and a CA that did not sign the broker fail fast (not
#    a retry loop) with an error that names the cause, publisher and
#    worker alike;
#  - the password appears in no output, log or /proc/PID/cmdline.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${KEYLANE_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
BIN=${KEYLANE_BIN:-$SRC/build/bin/keylane}
KAFKA_SH=$SRC/deploy/kafka/kafka.sh
if [ -z "${KEYLANE_TEST_KAFKA_DIR:-}" ]; then
  echo "the secured listeners are those of the suite's own Kafka (KEYLANE_TEST_KAFKA_DIR); not run on KEYLANE_TEST_BOOTSTRAP's"
  exit 77
fi
KDIR=$KEYLANE_TEST_KAFKA_DIR
[ -f "$KDIR/tls/secure.env" ] || {
  echo "FAILED: $KDIR/tls/secure.env is missing: the kafka1 fixture must start Kafka with --secure"
  exit 1
}
# shellcheck disable=SC1091
. "$KDIR/tls/secure.env"
SECRET=$(cat "$PLAIN_PASSWORD_FILE")
passed=0 failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }

W=$(mktemp -d /tmp/keylane-secure-XXXXXX)
PIDS=()
cleanup() {
  set +e
  [ ${#PIDS[@]} -eq 0 ] || kill -KILL "${PIDS[@]}" 2>/dev/null
  wait 2>/dev/null
  if [ "$failed" = 0 ] && [ -z "${KEYLANE_TEST_KEEP:-}" ]; then rm -rf "$W"; else echo "kept $W"; fi
}
trap cleanup EXIT

T=secure$$
PARTS=4
"$KAFKA_SH" topic create "$T" --partitions $PARTS --dir "$KDIR" >/dev/null
"$KAFKA_SH" topic create "$T.dlq" --partitions 1 --dir "$KDIR" >/dev/null

# SASL_SSL: the user from the environment, the password from its file, as a
# Kubernetes Secret mounted as a file would give it.
conf() { # FILE PROTOCOL MECHANISM USER PASSWORD CA [LINES...]
  local f=$1
  {
    echo "# keylane's settings for the secured test Kafka"
    echo "kafka.security.protocol = $2"
    [ -z "$3" ] || echo "kafka.sasl.mechanism = $3"
    [ -z "$4" ] || echo "kafka.sasl.username = $4"
    [ -z "$5" ] || echo "kafka.sasl.password = $5"
    echo "kafka.ssl.ca.location = $6"
    echo "store.uri = $W/store"
    echo "worker.group = g-$T"
    shift 6
    for line in "$@"; do echo "$line"; done
  } >"$f"
  chmod 600 "$f"
}
conf "$W/sasl.conf" SASL_SSL PLAIN '${KL_T_KAFKA_USER}' "@$PLAIN_PASSWORD_FILE" "$CA" \
  "kafka.bootstrap.servers = $SASL_SSL_BOOTSTRAP"
export KL_T_KAFKA_USER=$PLAIN_USER

# 400 credits of 1..4 and 40 transfers over 8 accounts; the expected
# balances as the ledger will show them.
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
bal = {}
with open(w + "/events.jsonl", "w") as f:
    for i in range(400):
        k = "acct-%d" % (i % 8)
        a = i % 4 + 1
        bal[k] = bal.get(k, 0) + a
        f.write(json.dumps({"key": k, "type": "credit", "id": "c%d" % i,
                            "payload": {"amount": a, "seq": i // 8 + 1}}) + "\n")
    for i in range(40):
        src, dst = "acct-%d" % (i % 8), "acct-%d" % ((i + 3) % 8)
        bal[src] -= 2
        bal[dst] += 2
        f.write(json.dumps({"key": src, "type": "transfer", "id": "t%d" % i,
                            "payload": {"amount": 2, "to": dst, "seq": 51 + i // 8}}) + "\n")
json.dump(bal, open(w + "/expected.json", "w"))
PY

t0=$SECONDS
if "$BIN" publish --config "$W/sasl.conf" -t "$T" <"$W/events.jsonl" >"$W/publish.out" 2>"$W/publish.err"; then
  ok "440 events published over SASL_SSL from a --config file ($((SECONDS - t0)) s)"
else
  bad "publish over SASL_SSL: $(tail -5 "$W/publish.err")"
fi

for i in 0 1; do
  "$BIN" worker --config "$W/sasl.conf" -t "$T" --handler ledger \
    --metrics-listen 127.0.0.1:0 >"$W/worker-$i.log" 2>&1 &
  PIDS+=($!)
done

# The ledger: every balance as computed, follow-ups included.
ledger_exact() {
  "$BIN" ledger --config "$W/sasl.conf" --json >"$W/ledger.json" 2>"$W/ledger.err" || return 1
  python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
want = json.load(open(w + "/expected.json"))
got = {k: v["balance"] for k, v in json.load(open(w + "/ledger.json"))["balances"].items()}
sys.exit(0 if got == want else 1)
PY
}
for _ in $(seq 300); do ledger_exact && break; sleep 0.2; done
if ledger_exact; then
  ok "a fleet of two workers on SASL_SSL applied every event and follow-up exactly once"
else
  bad "the ledger is not exact: $(cat "$W/ledger.json") want $(cat "$W/expected.json"); $(tail -5 "$W/worker-0.log")"
fi
grep -q "assigned partition=" "$W/worker-0.log" "$W/worker-1.log" &&
  ok "the workers were assigned partitions over SASL_SSL" || bad "no assignment: $(tail -5 "$W/worker-0.log")"

# Mutual TLS: the client's certificate, signed by the cluster's CA.
conf "$W/mtls.conf" SSL '' '' '' "$CA" "kafka.bootstrap.servers = $MTLS_BOOTSTRAP" \
  "kafka.ssl.certificate.location = $CLIENT_CERT" "kafka.ssl.key.location = $CLIENT_KEY"
echo '{"key":"acct-0","type":"credit","id":"mtls-1","payload":{"amount":1000,"seq":100}}' |
  "$BIN" publish --config "$W/mtls.conf" -t "$T" >"$W/mtls.out" 2>"$W/mtls.err" &&
  ok "published over mutual TLS" || bad "publish over mutual TLS: $(tail -3 "$W/mtls.err")"
# SASL_SSL with SCRAM-SHA-512: published, or refused at once naming
# librdkafka's SCRAM bug with Kafka 4 (then the credit is sent over PLAIN).
conf "$W/scram.conf" SASL_SSL SCRAM-SHA-512 "$SCRAM_USER" "@$SCRAM_PASSWORD_FILE" "$CA" \
  "kafka.bootstrap.servers = $SASL_SSL_BOOTSTRAP"
echo '{"key":"acct-1","type":"credit","id":"scram-1","payload":{"amount":1000,"seq":100}}' >"$W/scram.jsonl"
t0=$SECONDS
if "$BIN" publish --config "$W/scram.conf" -t "$T" <"$W/scram.jsonl" >"$W/scram.out" 2>"$W/scram.err"; then
  ok "published over SASL_SSL with SCRAM-SHA-512"
elif grep -q 'librdkafka before 2.6.1' "$W/scram.err" && ((SECONDS - t0 <= 30)); then
  ok "SCRAM-SHA-512 on this librdkafka fails in $((SECONDS - t0)) s naming the cause (librdkafka before 2.6.1 against Kafka 4)"
  "$BIN" publish --config "$W/sasl.conf" -t "$T" <"$W/scram.jsonl" >>"$W/scram.out" 2>&1 ||
    bad "publish over PLAIN: $(tail -3 "$W/scram.out")"
else
  bad "SCRAM-SHA-512 after $((SECONDS - t0)) s: $(tail -3 "$W/scram.err")"
fi
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
want = json.load(open(w + "/expected.json"))
want["acct-0"] += 1000
want["acct-1"] += 1000
json.dump(want, open(w + "/expected.json", "w"))
PY
for _ in $(seq 150); do ledger_exact && break; sleep 0.2; done
ledger_exact && ok "the workers applied the events published over mutual TLS and PLAIN" ||
  bad "not applied: $(cat "$W/ledger.json")"

for pid in "${PIDS[@]}"; do tr '\0' ' ' <"/proc/$pid/cmdline" >>"$W/cmdlines"; echo >>"$W/cmdlines"; done
# What the workers export, for the search for the password below.
for i in 0 1; do
  port=$(sed -n 's/.*serving \/metrics.* (port \([0-9]*\)).*/\1/p' "$W/worker-$i.log" | head -1)
  curl -s "http://127.0.0.1:$port/metrics" >"$W/metrics-$i.txt" || true
  curl -s "http://127.0.0.1:$port/healthz?format=json" >"$W/healthz-$i.json" || true
done
grep -q '^keylane_worker_events_applied_total ' "$W/metrics-0.txt" &&
  ok "the workers' /metrics were read (searched for the password below)" ||
  bad "no /metrics from worker 0: $(grep -i metrics "$W/worker-0.log" | head -2)"
for i in 0 1; do
  kill -TERM "${PIDS[$i]}"
  rc=0
  wait "${PIDS[$i]}" || rc=$?
  [ $rc = 0 ] && ok "worker $i stopped with exit 0" || bad "worker $i exited $rc: $(tail -3 "$W/worker-$i.log")"
done
PIDS=()

# Replay over SASL_SSL: everything was applied, so nothing applies again.
if "$BIN" replay --config "$W/sasl.conf" -t "$T" -p all --from earliest --handler ledger --json \
  >"$W/replay.json" 2>"$W/replay.err"; then
  python3 - "$W/replay.json" <<'PY' && ok "replay over SASL_SSL applied nothing twice" || bad "replay applied again: $(cat "$W/replay.json")"
import json, sys
o = json.load(open(sys.argv[1]))
total = o.get("totals", o)
sys.exit(0 if total.get("applied", 1) == 0 else 1)
PY
else
  bad "replay over SASL_SSL: $(tail -3 "$W/replay.err")"
fi
ledger_exact && ok "the ledger is exact after the replay" || bad "after replay: $(cat "$W/ledger.json")"

# Fail fast, naming the cause: a wrong password, an unknown CA.
echo 'not-the-password' >"$W/wrong.password"
chmod 600 "$W/wrong.password"
conf "$W/wrong.conf" SASL_SSL PLAIN "$PLAIN_USER" "@$W/wrong.password" "$CA" \
  "kafka.bootstrap.servers = $SASL_SSL_BOOTSTRAP"
conf "$W/ca.conf" SASL_SSL PLAIN "$PLAIN_USER" "@$PLAIN_PASSWORD_FILE" "$OTHER_CA" \
  "kafka.bootstrap.servers = $SASL_SSL_BOOTSTRAP"
fails_fast() { # NAME CONF PATTERN INPUT COMMAND...
  local name=$1 c=$2 pattern=$3 input=$4 rc=0 t0=$SECONDS
  shift 4
  timeout 60 "$BIN" "$@" --config "$c" -t "$T" <"$input" >"$W/$name.out" 2>"$W/$name.err" || rc=$?
  if [ $rc = 0 ] || [ $rc = 124 ]; then
    bad "$name: exit $rc after $((SECONDS - t0)) s, not a fast failure: $(tail -3 "$W/$name.err")"
  elif ((SECONDS - t0 > 30)); then
    bad "$name: failed only after $((SECONDS - t0)) s"
  elif ! grep -qiE "$pattern" "$W/$name.err"; then
    bad "$name: the error does not name the cause ($pattern): $(tail -3 "$W/$name.err")"
  else
    ok "$name fails in $((SECONDS - t0)) s (exit $rc) naming the cause: $(grep -iE "$pattern" "$W/$name.err" | head -1 | cut -c1-160)"
  fi
}
echo '{"key":"acct-2","type":"credit","id":"w-1","payload":{"amount":1,"seq":200}}' >"$W/one.jsonl"
refused="Kafka refused keylane's credentials \\(authentication\\).*Invalid username or password.*check kafka.sasl.mechanism"
tls="the TLS handshake with Kafka failed.*certificate verify failed.*check kafka.ssl.ca.location"
fails_fast publish-wrong-password "$W/wrong.conf" "^keylane publish: .*$refused" "$W/one.jsonl" publish
fails_fast worker-wrong-password "$W/wrong.conf" "^keylane worker: .*$refused" /dev/null worker --handler ledger
fails_fast publish-unknown-ca "$W/ca.conf" "^keylane publish: .*$tls" "$W/one.jsonl" publish
fails_fast worker-unknown-ca "$W/ca.conf" "^keylane worker: .*$tls" /dev/null worker --handler ledger

# keylane doctor says how it talks to Kafka and whether Kafka took it.
"$BIN" doctor --config "$W/sasl.conf" -t "$T" >"$W/doctor.out" 2>&1 || true
grep -q "^OK security: security.protocol SASL_SSL, sasl.mechanism PLAIN: authenticated" "$W/doctor.out" &&
  ok "doctor: SASL_SSL with PLAIN, authenticated" || bad "doctor: $(head -3 "$W/doctor.out")"
rc=0
"$BIN" doctor --config "$W/wrong.conf" -t "$T" >"$W/doctor-wrong.out" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q "^FAIL security: security.protocol SASL_SSL, sasl.mechanism PLAIN: Kafka refused keylane's credentials" "$W/doctor-wrong.out" &&
  ok "doctor: a wrong password is a FAIL naming the refusal" || bad "doctor, wrong password: $(head -3 "$W/doctor-wrong.out")"

# The password is nowhere: outputs, logs, command lines, `keylane config`.
"$BIN" config --config "$W/sasl.conf" --json >"$W/config.json" 2>&1
if grep -rlF -e "$SECRET" -e "$(cat "$SCRAM_PASSWORD_FILE")" "$W" >"$W/leaks"; then
  bad "the password appears in: $(cat "$W/leaks")"
else
  ok "the password appears in no output, log, command line, /metrics, /healthz or keylane config"
fi
grep -q '"key":"kafka.sasl.password","value":"(secret)"' "$W/config.json" &&
  ok "keylane config shows the password as (secret)" || bad "keylane config: $(cat "$W/config.json" | head -c 300)"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
