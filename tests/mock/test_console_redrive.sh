#!/usr/bin/env bash
# The console's dead letters in a real browser (Debian's chromium, driven
# through the DevTools protocol by tests/console/cdp.py): a key whose
# handler fails is dead-lettered; the page asks for the token and shows
# nothing of the API without it; the handler is fixed; another site's
# POSTs (a JSON one with the token, which the browser must ask first for,
# and a text/plain one, which it need not) redrive nothing; the operator
# ticks the letter, sees the dry run say "applied", redrives it and sees
# it applied and marked redriven. The outbox view shows. The
# screenshots are saved in the build directory (docs/console.md shows
# them).
set -euo pipefail
SRC=${KEYLANE_SOURCE_DIR:?}
OUT=${KEYLANE_BUILD_DIR:?}
. "$SRC/tests/console/fleet.sh"
need_chromium
start_fleet
TOKEN=console-test-token-0123456789
KEYLANE_CONSOLE_TOKEN=$TOKEN start_console console2 --worker "$W1" --worker "$W2" \
  --handler "exec:python3 $W/handler.py"

# The letter is written, and both workers own partitions, before the
# browser looks: the page's refresh is not what is tested. A minute at most: the group can take
# several rounds to settle (start_worker in tests/console/fleet.sh).
for _ in $(seq 300); do
  letters=$(curl -sf -H "Authorization: Bearer $TOKEN" "${CONSOLE}api/letters?key=dead-2" || true)
  fleet=$(curl -sf -H "Authorization: Bearer $TOKEN" "${CONSOLE}api/fleet" || true)
  grep -q '"reason":"handler_fail"' <<<"$letters" && grep -q "\"owner\":\"$W1\"" <<<"$fleet" &&
    grep -q "\"owner\":\"$W2\"" <<<"$fleet" && break
  sleep 0.2
done
grep -q '"reason":"handler_fail"' <<<"$letters" || fail "dead-2 was never dead-lettered: $letters"
# Another site: a page on another port of this host.
mkdir "$W/site"
echo '<!DOCTYPE html><title>another site</title>' >"$W/site/index.html"
python3 -u -m http.server 0 --bind 127.0.0.1 --directory "$W/site" >"$W/site.out" 2>"$W/site.log" &
pids+=($!)
site=$(wait_for "$W/site.out" '.*port \([0-9]*\).*') || fail "no other site"

python3 - "$SRC/tests/console" "$W" "$CONSOLE" "$site" "$TOKEN" "$OUT" "$BIN" "$B" <<'PY' || fail "the browser test failed (above)"
import json, os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from cdp import Browser
w, console, site, token, out, keylane, bootstrap = sys.argv[2:]

def letter(b):
    rows = [r for r in b.rows("dead-letters") if r[3] == "dead-2"]
    return rows[0] if rows else None

with Browser(os.path.join(w, "cdp-profile"), os.path.join(w, "chromium.log")) as b:
    # Without the token: the form asks for it, and no dead letter shows.
    b.open(console)
    b.wait("!document.getElementById('token-form').hidden")
    assert b.rows("dead-letters") == [], b.rows("dead-letters")
    print("ok: without the token the page asks for it and shows no letter")

    # The handler is fixed: a redrive would apply the letter now.
    open(os.path.join(w, "fixed"), "w").close()

    # A page of another site POSTs a redrive: with JSON and the token the
    # browser asks first (OPTIONS, refused), so the POST is never sent; as
    # text/plain it is sent, and refused. Either way nothing is redriven.
    b.open(f"http://127.0.0.1:{site}/")
    got = b.js(f"""(async () => {{
      const body = JSON.stringify({{letters: ["0@0", "1@0", "2@0", "3@0"], dry_run: false}});
      const out = [];
      try {{
        await fetch("{console}api/redrive", {{method: "POST", body,
          headers: {{"Content-Type": "application/json", Authorization: "Bearer {token}"}}}});
        out.push("json: sent");
      }} catch (e) {{ out.push("json: " + e.name); }}
      const r = await fetch("{console}api/redrive", {{method: "POST", body, mode: "no-cors",
        headers: {{"Content-Type": "text/plain"}}}});
      out.push("text: " + r.type);
      return out;
    }})()""")
    assert got == ["json: TypeError", "text: opaque"], got
    print(f"ok: the cross-site POSTs: {got}")

    # With the token: the fleet, the dead letter (not redriven by the other
    # site's POSTs), the outbox.
    b.open(console)
    b.wait("!document.getElementById('token-form').hidden")
    b.js(f"document.getElementById('token').value = '{token}';"
         "document.querySelector('#token-form button').click()")
    b.wait("[...document.querySelectorAll('#dead-letters tr')].some((r) => r.cells[3].textContent === 'dead-2')")
    row = letter(b)
    assert row[4] == "handler_fail" and row[7] == "no", row
    assert "dead key refused by the test handler" in row[8], row
    assert "follow-up(s) waiting" in b.js("document.getElementById('outbox-total').textContent")
    assert len(b.rows("partitions")) == 4
    print(f"ok: the letter shows: {row}")

    # The dry run of the ticked letter, then its redrive.
    ref = row[1]
    b.js(f"document.querySelector('#dead-letters input[value=\"{ref}\"]').click()")
    assert b.js("document.getElementById('redrive-go').disabled"), "redrive before a dry run"
    b.js("document.getElementById('redrive-dry').click()")
    b.wait("document.getElementById('redrive-result').textContent.startsWith('Dry run')")
    outcomes = b.rows("redrive-outcomes")
    assert outcomes == [[ref, "dead-2", "c-dead", "applied", ""]], outcomes
    assert not b.js("document.getElementById('redrive-go').disabled")
    assert letter(b)[7] == "no", "a dry run redrove"
    b.screenshot(os.path.join(out, "console-letters.png"))
    b.js("document.getElementById('redrive-go').click()")
    b.wait("document.getElementById('redrive-result').textContent.startsWith('Redriven')")
    outcomes = b.rows("redrive-outcomes")
    assert outcomes == [[ref, "dead-2", "c-dead", "applied", ""]], outcomes
    b.wait("(() => { const r = [...document.querySelectorAll('#dead-letters tr')]"
           ".find((r) => r.cells[3].textContent === 'dead-2'); return r && r.cells[7].textContent === 'yes'; })()")
    print(f"ok: redriven from the page: {outcomes[0]}, and shown redriven")
    # The redrive took partition 2's epoch: the fencing view says so.
    b.wait("[...document.querySelectorAll('#fences tr')].some((r) => r.cells[4].textContent === 'redrive')")
    fence = [r for r in b.rows("fences") if r[4] == "redrive"][0]
    assert fence[1] == "2" and int(fence[3]) == int(fence[2]) + 1, fence
    assert "commits refused by a newer epoch" in b.js("document.getElementById('refused').textContent")
    # The owner of partition 2 applies an event there: its commit is
    # refused by the redrive's epoch, and the worker lists it.
    subprocess.run([keylane, "publish", "-b", bootstrap, "-t", "events"], check=True,
                   input=b'{"key":"acct-1","type":"t","id":"c-after","payload":{}}\n',
                   stdout=subprocess.DEVNULL)
    b.wait("[...document.querySelectorAll('#refused-commits tr')].some((r) => r.cells[2].textContent === '2')")
    refusal = [r for r in b.rows("refused-commits") if r[2] == "2"][0]
    assert refusal[3] == fence[2] and refusal[4] == fence[3], (refusal, fence)
    print(f"ok: the fencing view: the epoch change {fence}, the refused commit {refusal}")
    b.screenshot(os.path.join(out, "console-redrive.png"))

    # One letter opened: the envelope decoded, the error, its origin.
    b.open(console + "#letter=" + ref.replace("@", "/"))
    b.wait("document.getElementById('letter-view').textContent.includes('c-dead')")
    view = b.js("Object.fromEntries([...document.querySelectorAll('#letter-view dt')]"
                ".map((t) => [t.textContent, t.nextElementSibling.textContent]))")
    assert view["key"] == "dead-2" and view["reason"] == "handler_fail", view
    assert view["payload"] == '{"n":1}' and view["redriven"] == "yes", view
    assert view["origin"].startswith("events partition 2 offset "), view
    print(f"ok: the letter opened: {view}")
PY
python3 - "$OUT/console-letters.png" "$OUT/console-redrive.png" <<'PY' || fail "the screenshots are not 1280x900 PNGs"
import struct, sys
for path in sys.argv[1:]:
    head = open(path, "rb").read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    assert struct.unpack(">II", head[16:24]) == (1280, 900), path
PY
echo "ok: a dead letter redriven from the page; screenshots in $OUT"
