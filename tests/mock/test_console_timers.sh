#!/usr/bin/env bash
# keylane console's timers (issue 36): on an embedded cluster with two
# workers, delayed events published with `keylane publish` wait as timers,
# and GET /api/timers lists them the soonest first, with the fields and
# values `keylane store timers --json` prints for them, no payload unless
# asked; limit= cuts the page (and says more wait), partition= and key=
# narrow it; the key view lists the key's timers. Bad input is refused
# with 400 naming the fix. In Debian's chromium, the page shows the timers
# table and the key view the key's timers (a screenshot of the page is
# saved in the build directory).
SRC=${KEYLANE_SOURCE_DIR:?}
. "$SRC/tests/console/fleet.sh"
need_chromium
start_fleet

# STATUS PATH: the answer's body, when its status is STATUS.
probe() {
  got=$(curl -s -o "$W/body" -w '%{http_code}' "${CONSOLE%/}$2") || fail "GET $2: no answer"
  [ "$got" = "$1" ] || fail "GET $2: $got, want $1: $(head -c 300 "$W/body")"
  cat "$W/body"
}
# PATH WORDS: a 400 whose error names WORDS.
refused() {
  body=$(probe 400 "$1")
  grep -qF "$2" <<<"$body" || fail "GET $1: the error does not say \"$2\": $body"
}

# Four delayed events of three keys, due in 30 minutes to 3 hours.
{
  echo '{"key":"later-1","type":"remind","id":"t-1","delay":"1h","payload":{"n":1}}'
  echo '{"key":"later-1","type":"remind","id":"t-2","delay":"2h","payload":{"n":2}}'
  echo '{"key":"later-2","type":"release","id":"t-3","delay":"30m","payload":{"n":3}}'
  echo '{"key":"later-3","type":"charge","id":"t-4","delay":"3h","payload":{"n":4}}'
} | "$BIN" publish -b "$B" -t events >/dev/null
# The workers schedule them as they read them: a minute at most (the group
# can take several rounds to settle: start_worker in fleet.sh).
for _ in $(seq 300); do
  timers=$(probe 200 /api/timers)
  [ "$(grep -o '"id":"t-' <<<"$timers" | wc -l)" = 4 ] && break
  sleep 0.2
done
"$BIN" store timers --store "$W/store" --json >"$W/store-timers.json" ||
  fail "keylane store timers failed"
parts=$(for k in later-1 later-2 later-3; do "$BIN" route --partitions 4 "$k" | cut -f2; done | tr '\n' ' ')
python3 - "$timers" "$W/store-timers.json" "$parts" <<'PY' || fail "/api/timers: $timers"
import json, sys
doc = json.loads(sys.argv[1])
listed = json.load(open(sys.argv[2]))
part = dict(zip(["later-1", "later-2", "later-3"], map(int, sys.argv[3].split())))
rows = doc["timers"]
assert doc["topic"] == "events" and doc["limit"] == 100 and doc["more"] is False, doc
assert doc["partition"] is None and doc["key"] is None, doc
assert [r["id"] for r in rows] == ["t-3", "t-1", "t-2", "t-4"], rows
assert [r["type"] for r in rows] == ["release", "remind", "remind", "charge"], rows
dues = [r["due_ms"] for r in rows]
assert dues == sorted(dues) and dues[-1] - dues[0] >= 2.5 * 3600 * 1000, dues
for r in rows:
    assert r["partition"] == part[r["key"]], r
    assert "payload" not in r and "payload_b64" not in r, r
    assert r["due_now"] is False and r["offset"] >= 0, r
# the same timers, fields and values as `keylane store timers --json`
fields = ("topic", "partition", "key", "key_escaped", "id", "id_escaped", "due",
          "due_ms", "offset")
same = {r["id"]: {f: r[f] for f in fields} for r in listed["timers"]}
assert {r["id"]: {f: r[f] for f in fields} for r in rows} == same, (rows, same)
PY

# a page of 2: the soonest two, and more wait
python3 - "$(probe 200 '/api/timers?limit=2')" <<'PY' || fail "/api/timers?limit=2"
import json, sys
d = json.loads(sys.argv[1])
assert [r["id"] for r in d["timers"]] == ["t-3", "t-1"] and d["more"] is True, d
assert d["limit"] == 2, d
PY
# one key; its payloads when asked
python3 - "$(probe 200 '/api/timers?key=later-1&payload=1')" <<'PY' || fail "/api/timers?key=later-1"
import json, sys
d = json.loads(sys.argv[1])
assert [r["id"] for r in d["timers"]] == ["t-1", "t-2"] and d["more"] is False, d
assert [r["payload"] for r in d["timers"]] == [{"n": 1}, {"n": 2}], d
assert d["key"] == "later-1", d
PY
# one partition: later-3's, and only the timers of keys in it
p3=$("$BIN" route --partitions 4 later-3 | cut -f2)
python3 - "$(probe 200 "/api/timers?partition=$p3")" "$p3" <<'PY' || fail "/api/timers?partition=$p3"
import json, sys
d, p = json.loads(sys.argv[1]), int(sys.argv[2])
assert d["partition"] == p and d["timers"], d
assert all(r["partition"] == p for r in d["timers"]), d
assert "t-4" in [r["id"] for r in d["timers"]], d
PY
python3 - "$(probe 200 '/api/timers?key=acct-1')" <<'PY' || fail "/api/timers?key=acct-1"
import json, sys
d = json.loads(sys.argv[1])
assert d["timers"] == [] and d["more"] is False, d
PY
# the key view lists the key's timers; a key with none has none
python3 - "$(probe 200 /api/keys/later-1)" "$(probe 200 /api/keys/acct-1)" <<'PY' || fail "/api/keys/later-1"
import json, sys
k, idle = json.loads(sys.argv[1]), json.loads(sys.argv[2])
t = k["timers"]
assert [r["id"] for r in t["pending"]] == ["t-1", "t-2"] and t["more"] is False, k
assert t["error"] is None and all(r["key"] == "later-1" for r in t["pending"]), k
assert idle["timers"]["pending"] == [], idle
PY

refused "/api/timers?limit=0" "1..1000; ask for 1 or more, in digits only"
refused "/api/timers?limit=+5" "1..1000; ask for 1 or more, in digits only"
refused "/api/timers?limit=%205" "not a number of timers"
refused "/api/timers?limit=1001" "ask for fewer"
refused "/api/timers?limit=x" "not a number of timers"
refused "/api/timers?partition=-1" "is not a partition number 0..4095"
refused "/api/timers?partition=4096" "is not a partition number 0..4095"
refused "/api/timers?partition=" "is not a partition number"
refused "/api/timers?key=" "1 to 1024 bytes"
refused "/api/timers?key=%ZZ" "percent-encoded"
refused "/api/timers?key=$(printf 'k%.0s' $(seq 1025))" "1 to 1024 bytes"
refused "/api/timers?payload=yes" "is neither 1"
refused "/api/timers?limit=1&limit=2" "limit is given twice; give it once"
refused "/api/timers?state=due" 'takes partition=, key=, limit= and payload= only; drop \"state=due\"'
# a partition the store does not hold is not an empty page (as `keylane
# store timers --partition` says): the fleet holds 4
body=$(probe 404 "/api/timers?partition=4")
grep -qF "the store has no partition 4 of topic" <<<"$body" &&
  grep -qF "it has 4 partitions, the highest 3" <<<"$body" ||
  fail "/api/timers?partition=4: $body"
body=$(probe 404 /api/timer)
grep -qF "/api/timers" <<<"$body" || fail "the 404 does not name /api/timers: $body"

# The page: its timers table, the soonest first; the key view's timers.
browse "$CONSOLE" --dump-dom >"$W/page.html" || fail "chromium could not render $CONSOLE"
browse "${CONSOLE}#key=later-1" --dump-dom >"$W/key.html" || fail "chromium could not render the key view"
python3 - "$(python3 "$SRC/tests/console/page.py" "$W/page.html")" \
  "$(python3 "$SRC/tests/console/page.py" "$W/key.html")" <<'PY' || fail "the page does not show the timers"
import json, sys
rows = json.loads(sys.argv[1])["tables"].get("timers-rows", [])
assert [(r[2], r[3], r[4]) for r in rows] == [
    ("later-2", "t-3", "release"), ("later-1", "t-1", "remind"),
    ("later-1", "t-2", "remind"), ("later-3", "t-4", "charge")], rows
assert all(r[0].endswith("Z") for r in rows), rows
terms = json.loads(sys.argv[2])["terms"]
shown = terms.get("timers", "")
assert "t-1 due " in shown and "t-2 due " in shown and "(remind)" in shown, terms
print("ok: the page lists", len(rows), "timers; the key view:", shown)
PY
# The whole page with the key view of a key with timers, for
# docs/console.md (the last --window-size is the one chromium takes).
browse "${CONSOLE}#key=later-1" --window-size=1280,1700 \
  --screenshot="${KEYLANE_BUILD_DIR:?}/console-timers.png" >/dev/null ||
  fail "no screenshot of the timers"
echo "ok: /api/timers, the key view's timers and the page; screenshot in $KEYLANE_BUILD_DIR/console-timers.png"
