#!/usr/bin/env bash
# A partition the log guard stopped, as the console shows it: a worker
# applies three events, then its store meets a new cluster whose log is
# empty (the topic "recreated"), so the partitions whose watermark is past
# the log's end stop (went_backwards). The page, in Debian's chromium,
# shows them STOPPED with the worker's reason and what to do
# (`keylane store reset`), the others still owned; the screenshot is saved
# in the build directory.
set -euo pipefail
SRC=${KEYLANE_SOURCE_DIR:?}
OUT=${KEYLANE_BUILD_DIR:?}
. "$SRC/tests/console/fleet.sh"
need_chromium

start_cluster cluster1
for k in a b c; do echo "{\"key\":\"$k\",\"type\":\"t\",\"id\":\"s-$k\",\"payload\":{}}"; done |
  "$BIN" publish -b "$B" -t events >/dev/null
start_worker worker1
for _ in $(seq 150); do
  applied=$(curl -sf "$URL/v1/partitions" |
    python3 -c 'import json, sys; print(sum(p["watermark"] for p in json.load(sys.stdin)["partitions"]))' || true)
  [ "$applied" = 3 ] && break
  sleep 0.2
done
[ "$applied" = 3 ] || fail "the worker applied $applied of 3 events"
kill "$WORKER" "$CLUSTER"
wait "$WORKER" "$CLUSTER" 2>/dev/null || true

start_cluster cluster2
# The embedded cluster cannot recreate a topic: a new cluster stands in for
# it, and the store is told that it is the fleet's (store bind), as an
# operator moving the fleet would; else every partition would stop as
# another cluster's (cluster_mismatch) before its log is looked at.
"$BIN" store bind -t events -b "$B" -g console --store "$W/store" >/dev/null ||
  fail "store bind refused the new cluster"
start_worker worker2
start_console console --worker "$URL"
stopped=$("$BIN" store stats --store "$W/store" --json |
  python3 -c 'import json, sys; print(sorted(p["partition"] for p in json.load(sys.stdin)["partitions"] if p["watermark"] > 0))')
nstopped=$(python3 -c "print(len($stopped))")
for _ in $(seq 150); do
  fleet=$(curl -sf "${CONSOLE}api/fleet" || true)
  [ "$(grep -o '"status":"STOPPED"' <<<"$fleet" | wc -l)" -ge "$nstopped" ] && break
  sleep 0.2
done

browse "$CONSOLE" --dump-dom >"$W/page.html" || fail "chromium could not render $CONSOLE"
python3 - "$(python3 "$SRC/tests/console/page.py" "$W/page.html")" "$stopped" "$URL" <<'PY' ||
import json, sys
rows = json.loads(sys.argv[1])["tables"].get("partitions", [])
want, url = json.loads(sys.argv[2]), sys.argv[3]
assert want, "no partition was applied to"
assert len(rows) == 4, rows
got = [int(r[0]) for r in rows if r[2] == "STOPPED"]
# A new owner checks the log before it takes the partition: every one
# whose log ends below the store's watermark is stopped.
assert got == want, f"stopped {got}, want {want}: {rows}"
for r in rows:
    if int(r[0]) in got:
        assert r[1] == url, r
        assert r[8].startswith("went_backwards: topic events partition"), r
        assert "keylane store reset" in r[8], r
    else:
        assert r[2] != "STOPPED" and r[8] == "", r
print(f"ok: partitions {got} (of {want} past the log's end) shown STOPPED, went_backwards, with the fix")
PY
  fail "the page does not show the stopped partitions"
browse "$CONSOLE" --screenshot="$OUT/console-stopped.png" >/dev/null || fail "no screenshot"
echo "ok: screenshot in $OUT/console-stopped.png"
