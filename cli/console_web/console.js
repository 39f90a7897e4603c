// keylane console: reads /api/fleet and /api/stuck every 2 s, and
// /api/keys/KEY when asked. Text is set with textContent, never as HTML.
"use strict";

const REFRESH_MS = 2000;
let token = sessionStorage.getItem("keylane-console-token") || "";

async function api(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const res = await fetch(path, { headers, cache: "no-store" });
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

async function refresh() {
  try {
    const [fleet, stuck] = await Promise.all([api("/api/fleet"), api("/api/stuck")]);
    renderFleet(fleet);
    renderStuck(stuck);
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

function dl(pairs) {
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
    out.replaceChildren(dl([
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
    ]));
  } catch (e) {
    out.replaceChildren(el("p", e.message, "error"));
  }
}

// #key=KEY in the address looks the key up: a link to a key's view.
function lookUpHash() {
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
document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = document.getElementById("token").value;
  sessionStorage.setItem("keylane-console-token", token);
  document.getElementById("token-form").hidden = true;
  refresh();
});
refresh();
