#!/usr/bin/env bash
# keylane console's JSON endpoints: what they answer for a key a worker
# holds and for a dead letter, and bad input refused with a status and a
# message that names the fix (bad key bytes, a key too long, a target too
# long, a page too big or not a number, a parameter it does not take, a
# bad letter reference, a method it does not take, a route it does not
# have); with a token, /api/ needs it (401 without or with a wrong one)
# and the page does not; a write (POST /api/redrive) needs the token, a
# JSON body and its own Origin, and is refused without a token set; a listener other than loopback
# without a token, and a worker URL it cannot reach by address, are
# refused at start.
SRC=${KEYLANE_SOURCE_DIR:?}
. "$SRC/tests/console/fleet.sh"
start_fleet

# STATUS METHOD PATH [CURL-OPTION...]: the answer's body, when its status
# is STATUS.
probe() {
  local want=$1 method=$2 path=$3
  shift 3
  got=$(curl -s -o "$W/body" -w '%{http_code}' -X "$method" "$@" "${CONSOLE%/}$path") ||
    fail "$method $path: no answer"
  [ "$got" = "$want" ] || fail "$method $path: $got, want $want: $(head -c 300 "$W/body")"
  cat "$W/body"
}
# PATH WORDS: a 400 whose error names WORDS.
refused() {
  body=$(probe 400 GET "$1")
  grep -q "$2" <<<"$body" || fail "GET $1: the error does not say \"$2\": $body"
}

# Until the key retries, every partition has its owner and the group's
# offsets have followed the watermarks (a commit a rebalance refused is
# sent again: test_offset_commit_retry). A minute at most: the group can take
# several rounds to settle (start_worker in tests/console/fleet.sh).
for _ in $(seq 300); do
  key=$(probe 200 GET /api/keys/poison-1)
  fleet=$(probe 200 GET /api/fleet)
  grep -q '"state":"retrying"' <<<"$key" && ! grep -q '"owner":null' <<<"$fleet" &&
    ! grep -q '"committed":-1' <<<"$fleet" && break
  sleep 0.2
done
python3 - "$key" "$("$BIN" route --partitions 4 poison-1 | cut -f2)" <<'PY' || fail "/api/keys/poison-1: $key"
import json, sys
k, part = json.loads(sys.argv[1]), int(sys.argv[2])
assert k["key"] == "poison-1" and k["partition"] == part and k["partitions"] == 4, k
assert k["state"] == "retrying", k
assert "poison key refused" in k["held"]["error"], k
assert k["store"]["epoch"] >= 1, k
assert len(k["workers"]) == 2 and all(w["ok"] for w in k["workers"]), k
PY
python3 - "$fleet" "$W1" "$W2" <<'PY' || fail "/api/fleet: $fleet"
import json, sys
f, w1, w2 = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
assert f["topic"] == "events" and f["group"] == "console", f
assert f["kafka"]["ok"] and f["store"]["ok"], f
assert [w["url"] for w in f["workers"]] == [w1, w2], f["workers"]
parts = f["partitions"]
assert [p["partition"] for p in parts] == [0, 1, 2, 3], parts
assert sum(p["end"] for p in parts) == 8, parts  # the 8 events published
for p in parts:
    assert p["owner"] in (w1, w2) and p["epoch"] >= 1, p
    assert 0 <= p["committed"] <= p["watermark"] <= p["end"], p
    assert p["lag"] == p["end"] - p["watermark"], p
PY
# An idle key: no worker holds it; its control bytes come back escaped.
key=$(probe 200 GET /api/keys/acct-1)
grep -q '"state":"idle"' <<<"$key" || fail "acct-1 is not idle: $key"
key=$(probe 200 GET /api/keys/%C3%A9t%00e)
grep -qF '"key":"ét\\x00e"' <<<"$key" || fail "the key's bytes are not escaped: $key"

refused /api/keys/ "1 to 1024 bytes"
refused /api/keys/%ZZ "percent-encoded"
refused "/api/keys/$(printf 'k%.0s' $(seq 1025))" "1 to 1024 bytes"
refused "/api/keys/$(printf '%%41%.0s' $(seq 1400))" "over 4095 bytes"
refused "/api/stuck?limit=0" "1..1000"
refused "/api/stuck?limit=1001" "ask for fewer"
refused "/api/stuck?limit=12abc" "not a number"
refused "/api/stuck?state=parked" "takes limit=N"
body=$(probe 405 POST /api/fleet -d x)
grep -q "read with GET; the one write is POST /api/redrive" <<<"$body" || fail "POST: $body"
# Without a token, only a loopback Host (DNS rebinding): a page of another
# name that resolves to 127.0.0.1 reads nothing.
port=${CONSOLE##*:}
port=${port%/}
body=$(probe 403 GET /api/fleet -H "Host: rebind.example:$port")
grep -q "DNS rebinding" <<<"$body" || fail "a foreign Host: $body"
probe 403 GET /api/stuck -H "Host: 127.0.0.1.rebind.example" >/dev/null
probe 403 GET /api/stuck -H "Host: [::2]:$port" >/dev/null
probe 200 GET /api/stuck -H "Host: localhost:$port" >/dev/null
probe 200 GET /api/stuck -H "Host: [::1]:$port" >/dev/null
probe 200 GET /api/stuck -H "Host: 127.0.0.2" >/dev/null
probe 200 GET / -H "Host: rebind.example:$port" >/dev/null
probe 404 GET /api/nothing >/dev/null
probe 404 GET /nothing >/dev/null
probe 200 GET "/api/stuck?limit=1" | grep -q '"limit":1' || fail "limit=1 is not taken"

# The dead letters: dead-2's, once its worker wrote it; bad queries and
# bad letter references refused with what to send instead.
for _ in $(seq 150); do
  letters=$(probe 200 GET "/api/letters?key=dead-2&reason=handler_fail&limit=5")
  grep -q '"key":"dead-2"' <<<"$letters" && break
  sleep 0.2
done
python3 - "$letters" <<'PY' || fail "/api/letters: $letters"
import json, sys
d = json.loads(sys.argv[1])
assert d["dlq_topic"] == "events.dlq" and d["limit"] == 5 and d["tail"] == 1000, d
[l] = d["letters"]
assert l["key"] == "dead-2" and l["reason"] == "handler_fail" and l["attempts"] == 1, l
assert l["topic"] == "events" and l["partition"] == 2 and not l["redriven"], l
assert "dead key refused" in l["error"], l
PY
ref=$(python3 -c 'import json, sys; l = json.loads(sys.argv[1])["letters"][0]; print(l["dlq_partition"], l["dlq_offset"])' "$letters")
letter=$(probe 200 GET "/api/letters/${ref/ //}")
python3 - "$letter" <<'PY' || fail "/api/letters/P/OFFSET: $letter"
import json, sys
d = json.loads(sys.argv[1])
assert d["key"] == "dead-2" and d["id"] == "c-dead" and d["payload"] == {"n": 1}, d
assert d["dead_letter"]["origin_partition"] == 2 and d["dead_letter"]["attempts"] == 1, d
assert d["letter"]["reason"] == "handler_fail", d
PY
probe 200 GET "/api/letters?key=acct-1" | grep -q '"letters":\[\]' || fail "acct-1 has no letter"
# A page is the newest N of them, whatever partitions they sit in; the
# others are left out (more), never all held.
for i in 10 11 12 13 14; do echo "{\"key\":\"dead-$i\",\"type\":\"t\",\"id\":\"c-dead-$i\",\"payload\":{}}"; done |
  "$BIN" publish -b "$B" -t events >/dev/null
for _ in $(seq 150); do
  all=$(probe 200 GET "/api/letters?reason=handler_fail")
  [ "$(grep -o '"dlq_offset"' <<<"$all" | wc -l)" -ge 6 ] && break
  sleep 0.2
done
page=$(probe 200 GET "/api/letters?reason=handler_fail&limit=2")
python3 - "$all" "$page" <<'PY' || fail "the newest 2 letters: $page, of $all"
import json, sys
every, page = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert len(every["letters"]) == 6 and not every["more"], every
assert every["scanned"] == 6, every
stamps = [l["timestamp_ms"] for l in every["letters"]]
assert stamps == sorted(stamps, reverse=True), stamps
assert len({l["dlq_partition"] for l in every["letters"]}) > 1, every
assert page["more"] and page["limit"] == 2, page
assert page["letters"] == every["letters"][:2], (page, every)
PY
probe 200 GET "/api/outbox" | grep -q '"partitions":\[\]' || fail "the outbox is not empty"
# No commit was refused. The group may have moved partitions while it
# settled (start_worker in fleet.sh): each move the console saw is a
# change whose newest epoch per partition is the store's now, made by a
# worker taking the partition (by null).
fencing=$(probe 200 GET /api/fencing)
fleet=$(probe 200 GET /api/fleet)
python3 - "$fencing" "$fleet" "$W1" "$W2" <<'PY' || fail "/api/fencing: $fencing, /api/fleet: $fleet"
import json, sys
d, f, w1, w2 = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
assert [w["url"] for w in d["workers"]] == [w1, w2], d
assert all(w["ok"] and w["refused_commits"] == 0 for w in d["workers"]), d
assert d["refused"] == [] and d["kept"] == 256 and d["seen"] == len(d["changes"]), d
epochs = {p["partition"]: p["epoch"] for p in f["partitions"]}
newest = {}
for c in d["changes"]:  # newest first
    assert 1 <= c["fenced_epoch"] < c["epoch"] and c["by"] is None, c
    newest.setdefault(c["partition"], c["epoch"])
assert all(epochs[p] == e for p, e in newest.items()), (newest, epochs)
PY
refused "/api/fencing?x=1" "no parameters"
refused "/api/letters?limit=501" "ask for fewer"
refused "/api/letters?limit=100000000" "not a number of letters"
refused "/api/letters?limit=0" "1..500"
refused "/api/letters?reason=lost" "handler_fail, max_attempts"
refused "/api/letters?key=%ZZ" "percent-encoded"
refused "/api/letters?key=" "1 to 1024 bytes"
refused "/api/letters?key=$(printf 'k%.0s' $(seq 1025))" "1 to 1024 bytes"
refused "/api/letters?from=0" "reason=, key= and limit="
refused "/api/letters/two/7" "PARTITION/OFFSET"
refused "/api/letters/0/-1" "PARTITION/OFFSET"
refused "/api/letters/0/7?x=1" "no parameters"
refused "/api/outbox?limit=1001" "ask for fewer"
refused "/api/outbox?partition=1" "takes limit=N"
body=$(probe 404 GET /api/letters/0/99999)
grep -q "no record at partition 0 offset 99999" <<<"$body" || fail "a letter that is not there: $body"
probe 404 GET /api/letters/77/0 >/dev/null
# Writes need a token, which this console has not.
body=$(probe 403 POST /api/redrive -H 'Content-Type: application/json' -d '{"letters":["2@0"],"dry_run":true}')
grep -q "need a token" <<<"$body" || fail "a write without a token set: $body"
probe 405 OPTIONS /api/redrive >/dev/null
probe 405 GET /api/redrive >/dev/null

# A worker that takes the connection and never answers, and a port where
# nothing listens: both shown unreachable, the page not held past 1 s.
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True); time.sleep(300)' >"$W/silent.port" &
pids+=($!)
SILENT=$(wait_for "$W/silent.port" '^\([0-9]*\)$') || fail "no silent listener"
closed=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# With a token, from the environment (never argv).
export KEYLANE_CONSOLE_TOKEN=console-test-token-0123456789
start_console console2 --worker "$W1" --worker "http://127.0.0.1:$SILENT" \
  --worker "http://localhost:$closed/"
probe 401 GET /api/fleet >/dev/null
probe 401 GET /api/fleet -H "Authorization: Bearer wrong-token-0123456789" >/dev/null
start=$(date +%s%N)
fleet=$(probe 200 GET /api/fleet -H "Authorization: Bearer $KEYLANE_CONSOLE_TOKEN")
took=$((($(date +%s%N) - start) / 1000000))
python3 - "$fleet" "$took" <<'PY' || fail "the unreachable workers: $fleet"
import json, sys
f, took = json.loads(sys.argv[1]), int(sys.argv[2])
ok, silent, closed = f["workers"]
assert ok["ok"] and len(f["partitions"]) == 4, f
assert not silent["ok"] and silent["error"] == "no answer within 1000 ms", silent
assert not closed["ok"] and "cannot connect" in closed["error"], closed
assert took < 2500, f"/api/fleet took {took} ms with a silent worker"
print(f"ok: a silent and a closed worker are unreachable; /api/fleet took {took} ms")
PY
probe 200 GET / | grep -q "keylane console" || fail "the page needs no token"

# A write: the token, a JSON body and, when the browser sends one, this
# console's own Origin; then a body it can read; then --handler, which
# this console was not given (409).
AUTH="Authorization: Bearer $KEYLANE_CONSOLE_TOKEN"
JSON="Content-Type: application/json"
DRY='{"letters":["2@0"],"dry_run":true}'
post() { # STATUS WORDS CURL-OPTION...
  local want=$1 words=$2
  shift 2
  body=$(probe "$want" POST /api/redrive "$@")
  grep -q "$words" <<<"$body" || fail "POST /api/redrive $*: the error does not say \"$words\": $body"
}
post 401 "needs Authorization" -H "$JSON" -d "$DRY"
post 401 "needs Authorization" -H "Authorization: Bearer wrong-token-0123456789" -H "$JSON" -d "$DRY"
post 415 "application/json" -H "$AUTH" -H "Content-Type: application/x-www-form-urlencoded" -d "$DRY"
post 415 "application/json" -H "$AUTH" -H "Content-Type: text/plain" -d "$DRY"
post 415 "application/json" -H "$AUTH" -d "$DRY" -H "Content-Type:"
post 403 "not this console's own" -H "$AUTH" -H "$JSON" -H "Origin: http://evil.example" -d "$DRY"
post 403 "not this console's own" -H "$AUTH" -H "$JSON" -H "Origin: null" -d "$DRY"
post 400 "not JSON" -H "$AUTH" -H "$JSON" -d '{"letters":'
post 400 "not a redrive" -H "$AUTH" -H "$JSON" -d '{"letters":["2@0"]}'
post 400 "not a redrive" -H "$AUTH" -H "$JSON" -d '{"letters":[],"dry_run":true}'
post 400 "not PARTITION@OFFSET" -H "$AUTH" -H "$JSON" -d '{"letters":["2/0"],"dry_run":true}'
post 400 "not PARTITION@OFFSET" -H "$AUTH" -H "$JSON" -d '{"letters":[20],"dry_run":true}'
post 400 "selected twice" -H "$AUTH" -H "$JSON" -d '{"letters":["2@0","1@0","2@0"],"dry_run":true}'
many=$(python3 -c 'import json; print(json.dumps({"letters": [f"0@{i}" for i in range(51)], "dry_run": True}))')
post 400 "50 at most" -H "$AUTH" -H "$JSON" -d "$many"
huge=$(python3 -c 'import json; print(json.dumps({"letters": ["0@1"] * 3000, "dry_run": True}))')
probe 413 POST /api/redrive -H "$AUTH" -H "$JSON" -d "$huge" >/dev/null
post 409 "without --handler" -H "$AUTH" -H "$JSON" -H "Origin: ${CONSOLE%/}" -d "$DRY"
post 409 "without --handler" -H "$AUTH" -H "$JSON" -d "$DRY"
probe 200 GET /api/stuck -H "Host: console.example" \
  -H "Authorization: Bearer $KEYLANE_CONSOLE_TOKEN" >/dev/null
unset KEYLANE_CONSOLE_TOKEN

# Refused at start, exit 2, with the fix.
start_refused() { # WORDS ARG...
  local words=$1
  shift
  set +e
  "$BIN" console -b "$B" -t events -g console --store "$W/store" "$@" >/dev/null 2>"$W/refused.err"
  rc=$?
  set -e
  [ "$rc" = 2 ] || fail "console $*: exit $rc, want 2: $(cat "$W/refused.err")"
  grep -q "$words" "$W/refused.err" || fail "console $*: the error does not say \"$words\": $(cat "$W/refused.err")"
}
start_refused "not a loopback address and no token" --listen 0.0.0.0:0
start_refused "is not an IP address" --worker http://worker.example:9464
start_refused "not a worker URL" --worker ftp://127.0.0.1:9464
start_refused "has no port" --worker http://127.0.0.1
echo "ok: the console's endpoints answer and refuse bad input"
