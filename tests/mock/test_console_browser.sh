#!/usr/bin/env bash
# The console in a real browser (Debian's chromium, headless): on an
# embedded cluster with two workers and a key whose handler keeps asking
# to retry, the rendered page shows the partition table with both workers
# as owners and the stuck key with its error; the screenshot is saved in
# the build directory (docs/console.md shows what it holds).
set -euo pipefail
SRC=${KEYLANE_SOURCE_DIR:?}
OUT=${KEYLANE_BUILD_DIR:?}
command -v chromium >/dev/null ||
  { echo "FAILED: no chromium: make test-deps installs it (deploy/install-deps.sh --test)" >&2; exit 1; }
. "$SRC/tests/console/fleet.sh"

# Both workers own partitions, and the poison key retries, before the
# browser looks: the page's 2 s refresh is not what is tested.
for _ in $(seq 150); do
  stuck=$(curl -sf "${CONSOLE}api/stuck" || true)
  fleet=$(curl -sf "${CONSOLE}api/fleet" || true)
  grep -q poison-1 <<<"$stuck" && grep -q "\"owner\":\"$W1\"" <<<"$fleet" &&
    grep -q "\"owner\":\"$W2\"" <<<"$fleet" && break
  sleep 0.2
done
grep -q poison-1 <<<"$stuck" || fail "/api/stuck never listed poison-1: $stuck"

browse() { # URL CHROMIUM-OPTION...
  local url=$1
  shift
  timeout 45 chromium --headless=new --no-sandbox --disable-gpu \
    --no-first-run --disable-dev-shm-usage --user-data-dir="$W/chrome" \
    --virtual-time-budget=3000 --window-size=1280,900 "$@" "$url" \
    2>>"$W/chromium.log"
}
browse "$CONSOLE" --dump-dom >"$W/page.html" || fail "chromium could not render $CONSOLE"
python3 - "$W/page.html" "$W1" "$W2" <<'PY' || fail "the rendered page is not the fleet's"
import html.parser, sys
page, w1, w2 = sys.argv[1:]
class Rows(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.tables = {}; self.body = None; self.row = None; self.cell = None
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tbody": self.body = self.tables.setdefault(a.get("id"), [])
        elif tag == "tr" and self.body is not None: self.row = []; self.body.append(self.row)
        elif tag == "td" and self.row is not None: self.cell = ""; self.row.append(self.cell)
    def handle_endtag(self, tag):
        if tag == "tbody": self.body = None
        if tag == "td" and self.row is not None: self.row[-1] = self.cell; self.cell = None
    def handle_data(self, data):
        if self.cell is not None: self.cell += data
r = Rows(); r.feed(open(page).read())
parts, stuck = r.tables.get("partitions", []), r.tables.get("stuck-keys", [])
assert len(parts) == 4, f"want 4 partition rows, got {parts}"
assert [p[0] for p in parts] == ["0", "1", "2", "3"], parts
owners = {p[1] for p in parts}
assert owners == {w1, w2}, f"owners {owners}, want both workers"
assert all(p[2] in ("OK", "WARN", "STALL") for p in parts), parts
poison = [s for s in stuck if s[0] == "poison-1"]
assert poison, f"poison-1 is not among the stuck keys: {stuck}"
assert poison[0][2] == "retrying", poison
assert "poison key refused by the test handler" in poison[0][6], poison
print(f"ok: the page shows {len(parts)} partitions owned by {sorted(owners)} and poison-1 retrying: {poison[0][6]}")
PY
# The key view, from a link to it (#key=KEY): its partition as
# `keylane route` computes it, the worker that holds it, and why it waits.
part=$("$BIN" route --partitions 4 poison-1 | cut -f2)
browse "${CONSOLE}#key=poison-1" --dump-dom >"$W/key.html" || fail "chromium could not render the key view"
python3 - "$W/key.html" "$part" <<'PY' || fail "the key view is wrong"
import html.parser, sys
page, part = sys.argv[1:]
class Terms(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.terms = {}; self.tag = None; self.last = None
    def handle_starttag(self, tag, attrs): self.tag = tag if tag in ("dt", "dd") else None
    def handle_data(self, data):
        if self.tag == "dt": self.last = data; self.terms[data] = ""
        elif self.tag == "dd" and self.last is not None: self.terms[self.last] += data
t = Terms(); t.feed(open(page).read()); d = t.terms
assert d.get("key") == "poison-1", d
assert d.get("partition") == f"{part} of 4", d
assert d.get("owner", "").startswith("http://127.0.0.1:"), d
assert d.get("state", "").startswith("retrying on http://127.0.0.1:"), d
assert "poison key refused by the test handler" in d.get("last error", ""), d
assert int(d.get("attempts", "0")) >= 1, d
print(f"ok: the key view shows poison-1 on partition {part}, {d['state']}: {d['last error']}")
PY
browse "${CONSOLE}#key=poison-1" --screenshot="$OUT/console-key.png" >/dev/null || fail "no screenshot of the key view"
browse "$CONSOLE" --screenshot="$OUT/console.png" >/dev/null || fail "no screenshot"
[ -s "$OUT/console.png" ] || fail "the screenshot $OUT/console.png is empty"
echo "ok: screenshot in $OUT/console.png"
