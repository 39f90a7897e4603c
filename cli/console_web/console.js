// keylane console: reads /api/fleet, /api/stuck, /api/letters,
// /api/outbox, /api/timers and /api/fencing every 2 s, /api/keys/KEY and /api/letters/P/OFFSET when
// asked, and POSTs /api/redrive: a dry run first, then the redrive of the
// same selection. Text is set with textContent, never as HTML.
"use strict";

const REFRESH_MS = 2000;
let token = sessionStorage.getItem("keylane-console-token") || "";

async function api(path, body) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const init = { headers, cache: "no-store" };
  if (body !== undefined) {
    // The one write: JSON, which a cross-site page cannot send unasked.
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.status === 401) {
    document.getElementById("token-form").hidden = false;
    throw new Error("this console needs a token");
  }
  const doc = await res.json();
  if (!res.ok) throw new Error(doc.error || res.status + " " + res.statusText);
  return doc;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function num(v) {
  return v === null || v === undefined || v < 0 ? "–" : v;
}

function row(cells) {
  const tr = el("tr");
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}

function lagBar(lag, most) {
  const td = el("td", null, "num");
  const bar = el("span", null, "bar");
  const fill = el("span");
  fill.style.width = (most > 0 && lag > 0 ? Math.max(2, (100 * lag) / most) : 0) + "%";
  bar.appendChild(fill);
  td.append(String(num(lag)) + " ", bar);
  return td;
}

let lastFleet = null;

function renderFleet(doc) {
  lastFleet = doc;
  document.getElementById("where").textContent =
    "topic " + doc.topic + ", group " + doc.group;
  const problems = [];
  if (!doc.kafka.ok) problems.push("Kafka: " + doc.kafka.error);
  if (!doc.store.ok) problems.push("store: " + doc.store.error);
  const workers = document.getElementById("workers");
  workers.replaceChildren("workers: ");
  for (const w of doc.workers) {
    workers.append(el("span", w.url + (w.ok ? " " : " unreachable (" + w.error + ") "),
                      w.ok ? "" : "unreachable"));
  }
  if (!doc.workers.length) workers.append("none given (--worker URL)");
  const most = Math.max(0, ...doc.partitions.map((p) => p.lag || 0));
  const body = document.getElementById("partitions");
  body.replaceChildren(...doc.partitions.map((p) => {
    const stop = p.stop_reason ? p.stop_reason + (p.stop_detail ? ": " + p.stop_detail : "") : "";
    return row([
      el("td", p.partition, "num"), el("td", p.owner || "–"),
      el("td", p.status, "status-" + p.status), el("td", num(p.epoch), "num"),
      el("td", num(p.watermark), "num"), el("td", num(p.committed), "num"),
      el("td", num(p.end), "num"), lagBar(p.lag, most), el("td", stop, "error"),
    ]);
  }));
  showProblems(problems);
}

function renderStuck(doc) {
  document.getElementById("stuck-total").textContent =
    doc.total + " key(s) retrying or parked" +
    (doc.keys.length < doc.total ? ", the first " + doc.keys.length + " shown" : "");
  const body = document.getElementById("stuck-keys");
  body.replaceChildren(...doc.keys.map((k) => row([
    k.key, el("td", k.partition, "num"), el("td", k.state, "status-WARN"),
    el("td", num(k.attempts), "num"), el("td", num(k.pending), "num"),
    k.worker, el("td", k.error || k.parked || "", "error"),
  ])));
}

function showProblems(list) {
  const p = document.getElementById("problems");
  p.hidden = list.length === 0;
  p.textContent = list.join("; ");
}

// ---- dead letters: a selection, its dry run, then its redrive ----

const selected = new Set(); // "P@OFFSET"
let dryRunOf = null; // the selection the last dry run was of

function lettersQuery() {
  const q = new URLSearchParams();
  const reason = document.getElementById("letters-reason").value;
  const key = document.getElementById("letters-key").value;
  if (reason) q.set("reason", reason);
  if (key) q.set("key", key);
  const s = q.toString().replace(/\+/g, "%20");
  return "/api/letters" + (s ? "?" + s : "");
}

function selectionChanged() {
  const none = selected.size === 0;
  document.getElementById("redrive-dry").disabled = none;
  document.getElementById("redrive-go").disabled =
    none || dryRunOf !== [...selected].sort().join(",");
}

function renderLetters(doc) {
  document.getElementById("letters-total").textContent =
    doc.letters.length + " dead letter(s) of " + doc.dlq_topic +
    (doc.more ? ", the newest " + doc.letters.length + " shown" : "") +
    " (the last " + doc.tail + " records of each partition read)";
  const body = document.getElementById("dead-letters");
  body.replaceChildren(...doc.letters.map((l) => {
    const ref = l.dlq_partition + "@" + l.dlq_offset;
    const box = el("input");
    box.type = "checkbox";
    box.value = ref;
    box.checked = selected.has(ref);
    box.disabled = l.redriven;
    box.addEventListener("change", () => {
      box.checked ? selected.add(ref) : selected.delete(ref);
      selectionChanged();
    });
    const check = el("td");
    check.append(box);
    const open = el("a", ref);
    open.href = "#letter=" + l.dlq_partition + "/" + l.dlq_offset;
    const link = el("td");
    link.append(open);
    return row([
      check, link, new Date(l.timestamp_ms).toLocaleString(), l.key,
      l.reason, el("td", num(l.attempts), "num"),
      l.topic + " " + l.partition + "@" + l.offset,
      el("td", l.redriven ? "yes" : "no", l.redriven ? "status-OK" : ""),
      el("td", l.error || l.truncated || "", "error"),
    ]);
  }));
}

function renderOutbox(doc) {
  document.getElementById("outbox-total").textContent =
    doc.listed + " follow-up(s) waiting to be published" +
    (doc.cut ? " (the first " + doc.listed + " shown)" : "");
  const rows = [];
  for (const p of doc.partitions)
    for (const f of p.pending)
      rows.push(row([
        el("td", p.partition, "num"), el("td", f.seq, "num"),
        f.destination || "(the source topic)", f.key, f.id, f.type,
        el("td", num(f.payload_bytes), "num"),
      ]));
  document.getElementById("outbox-rows").replaceChildren(...rows);
}

const TIMERS_PAGE = 50;

function timersQuery() {
  const key = document.getElementById("timers-key").value;
  const q = new URLSearchParams({ limit: TIMERS_PAGE });
  if (key) q.set("key", key);
  return "/api/timers?" + q.toString().replace(/\+/g, "%20");
}

function renderTimers(doc) {
  document.getElementById("timers-total").textContent =
    (doc.more ? "more than " : "") + doc.timers.length + " timer(s) pending" +
    (doc.key !== null ? " for key " + doc.key : "") +
    (doc.more ? ", the soonest " + doc.timers.length + " shown" : "") +
    (doc.malformed ? "; some records are malformed" : "");
  document.getElementById("timers-rows").replaceChildren(...doc.timers.map((t) => row([
    t.due + (t.due_now ? " (due)" : ""), el("td", t.partition, "num"),
    t.key_escaped, t.id_escaped || "(not an event)", t.type_escaped || "",
    el("td", t.offset, "num"),
  ])));
}

function timersText(timers) {
  if (!timers.pending.length) return timers.error ? "unknown (" + timers.error + ")" : "none";
  return timers.pending.map((t) => t.id_escaped + " due " + t.due + " (" + t.type_escaped + ")")
    .join("\n") + (timers.more ? "\nand more" : "");
}

function renderFencing(doc) {
  document.getElementById("refused").replaceChildren(
    "commits refused by a newer epoch: ",
    ...doc.workers.map((w) => el("span", w.url + " " +
      (w.refused_commits === null ? "unknown (" + (w.error || "no metric") + ")" : w.refused_commits) + " ",
      w.ok ? "" : "unreachable")));
  document.getElementById("refused-commits").replaceChildren(...doc.refused.map((f) => row([
    new Date(f.at_ms).toLocaleString(), f.worker, el("td", f.partition, "num"),
    el("td", f.epoch, "num"), el("td", f.current_epoch, "num"),
  ])));
  document.getElementById("fences").replaceChildren(...doc.changes.map((f) => row([
    new Date(f.at_ms).toLocaleString(), el("td", f.partition, "num"),
    el("td", f.fenced_epoch, "num"), el("td", f.epoch, "num"),
    f.by || "a worker, replay or another tool",
  ])));
}

async function redrive(dryRun) {
  const out = document.getElementById("redrive-result");
  const letters = [...selected].sort();
  try {
    const r = await api("/api/redrive", { letters, dry_run: dryRun });
    dryRunOf = dryRun ? letters.join(",") : null;
    if (!dryRun) selected.clear();
    const rows = r.results.map((x) => row([
      x.dlq_partition + "@" + x.dlq_offset, x.key || "", x.id, x.outcome,
      el("td", x.error || "", "error"),
    ]));
    const table = el("table");
    table.append(el("tbody"));
    table.tBodies[0].id = "redrive-outcomes";
    table.tBodies[0].replaceChildren(...rows);
    const taken = r.taken.map((t) => "partition " + t.partition + " taken at epoch " + t.epoch +
      " (its owner at epoch " + t.previous_epoch + " is fenced until it takes it back)");
    out.replaceChildren(
      el("p", (dryRun ? "Dry run: what a redrive would do. " : "Redriven: ") +
        r.applied + " applied, " + r.republished + " republished, " +
        r.scheduled + " scheduled, " + r.skipped_duplicate + " duplicate, " + r.failed + " failed, " +
        r.pending + " pending" + (taken.length ? "; " + taken.join("; ") : ""),
        dryRun ? "" : "done"),
      table);
    if (!dryRun) refresh();
  } catch (e) {
    out.replaceChildren(el("p", e.message, "error"));
  }
  selectionChanged();
}

async function openLetter(ref) {
  const out = document.getElementById("letter-view");
  try {
    const d = await api("/api/letters/" + ref);
    const dl = d.dead_letter || {};
    out.replaceChildren(el("h3", "Dead letter " + ref.replace("/", "@")), dlList([
      ["key", d.key || d.key_b64 || "–"],
      ["id", d.id || "–"],
      ["type", d.type || "–"],
      ["reason", dl.reason || "–"],
      ["error", dl.error || d.error || "–"],
      ["attempts", num(dl.attempts)],
      ["origin", (dl.origin_topic || "?") + " partition " + dl.origin_partition +
        " offset " + dl.origin_offset],
      ["redriven", d.letter.redriven ? "yes" : "no"],
      ["payload", d.payload !== undefined ? JSON.stringify(d.payload) : d.payload_b64 || ""],
    ]));
  } catch (e) {
    out.replaceChildren(el("p", e.message, "error"));
  }
}

async function refresh() {
  try {
    const [fleet, stuck, letters, outbox, timers, fencing] = await Promise.all([
      api("/api/fleet"), api("/api/stuck"), api(lettersQuery()), api("/api/outbox"),
      api(timersQuery()), api("/api/fencing")]);
    renderFleet(fleet);
    renderStuck(stuck);
    renderLetters(letters);
    renderOutbox(outbox);
    renderTimers(timers);
    renderFencing(fencing);
    document.getElementById("updated").textContent =
      "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    showProblems([e.message]);
  }
  // The next one REFRESH_MS after this one ends: a slow answer (a worker
  // that does not answer takes 1 s) never stacks requests up.
  clearTimeout(refresh.timer);
  refresh.timer = setTimeout(refresh, REFRESH_MS);
}

function dlList(pairs) {
  const d = el("dl");
  for (const [k, v] of pairs) d.append(el("dt", k), el("dd", v));
  return d;
}

async function lookUp(key) {
  const out = document.getElementById("key-result");
  try {
    const k = await api("/api/keys/" + encodeURIComponent(key));
    const fleet = lastFleet || (await api("/api/fleet"));
    const part = fleet.partitions[k.partition];
    const h = k.held || {};
    out.replaceChildren(dlList([
      ["key", k.key],
      ["partition", k.partition + " of " + k.partitions],
      ["owner", (part && part.owner) || "none reported"],
      ["store", "epoch " + k.store.epoch + ", watermark " + k.store.watermark +
        (k.store.error ? " (" + k.store.error + ")" : "")],
      ["state", k.state + (h.worker ? " on " + h.worker : "") +
        (k.workers.some((w) => !w.ok) ? " (some workers did not answer)" : "")],
      ["attempts", num(h.attempts)],
      ["last error", h.error || h.parked || "–"],
      ["rows", k.store.rows.length ? k.store.rows.map((r) => JSON.stringify(r)).join("\n") : "none"],
      ["timers", timersText(k.timers)],
    ]));
  } catch (e) {
    out.replaceChildren(el("p", e.message, "error"));
  }
}

// #key=KEY in the address looks the key up: a link to a key's view;
// #letter=P/OFFSET opens a dead letter.
function lookUpHash() {
  if (location.hash.startsWith("#letter=")) {
    openLetter(location.hash.slice(8));
    return;
  }
  if (!location.hash.startsWith("#key=")) return;
  let key;
  try {
    key = decodeURIComponent(location.hash.slice(5));
  } catch (e) {
    key = location.hash.slice(5); // not percent-encoding: the text itself
  }
  document.getElementById("key-input").value = key;
  lookUp(key);
}

document.getElementById("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  location.hash = "key=" + encodeURIComponent(document.getElementById("key-input").value);
});
window.addEventListener("hashchange", lookUpHash);
lookUpHash();
document.getElementById("letters-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  refresh();
});
document.getElementById("timers-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  refresh();
});
document.getElementById("redrive-dry").addEventListener("click", () => redrive(true));
document.getElementById("redrive-go").addEventListener("click", () => redrive(false));
document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = document.getElementById("token").value;
  sessionStorage.setItem("keylane-console-token", token);
  document.getElementById("token-form").hidden = true;
  refresh();
});
refresh();
