"""deploy/grafana/keylane.json: the JSON parses, and every query names only
metrics keylane exports.

What keylane exports is read from its code: every name registered with
kl__metrics_counter/gauge/gauge_fn/histogram, or a helper named like them
(cli/metrics_server.c's ms_counter), in every source folder
(a histogram also exports NAME_bucket, NAME_sum and NAME_count). A query is
PromQL: once its strings, label matchers, ranges, grouping clauses and
Grafana variables are removed, every identifier left is a PromQL function
or keyword or one of those names.

Used by check_deploy.py: check_grafana(SRC, ok, bad).
"""
import glob
import json
import os
import re

REGISTER_RE = re.compile(
    r'\b\w*_(counter|gauge_fn|gauge|histogram)\(\s*[^,()]+,\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"')

PROMQL_WORDS = {
    # aggregations and their clauses
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk",
    "bottomk", "quantile", "count_values", "group", "by", "without",
    # vector matching and operators
    "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset",
    # functions
    "rate", "irate", "increase", "delta", "idelta", "deriv", "resets",
    "changes", "abs", "ceil", "floor", "round", "clamp", "clamp_min",
    "clamp_max", "histogram_quantile", "label_replace", "label_join",
    "vector", "scalar", "time", "timestamp", "absent", "absent_over_time",
    "sort", "sort_desc", "avg_over_time", "min_over_time", "max_over_time",
    "sum_over_time", "count_over_time", "last_over_time",
    "quantile_over_time", "predict_linear", "sgn", "exp", "ln", "log2",
    "log10", "sqrt",
    # Grafana's templating functions (variable queries)
    "label_values", "label_names", "metrics", "query_result",
    # numbers PromQL spells as words
    "inf", "nan",
}


def exported_metrics(src):
    names = set()
    for part in ("common", "event", "store", "broker", "worker", "handlers", "cli"):
        for path in glob.glob(os.path.join(src, part, "**", "*.c"), recursive=True):
            with open(path) as f:
                text = f.read()
            for kind, name in REGISTER_RE.findall(text):
                names.add(name)
                if kind == "histogram":
                    names.update(name + s for s in ("_bucket", "_sum", "_count"))
    return names


def query_metrics(expr):
    """@returns the identifiers of @p expr that are not PromQL words."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', " ", expr)           # strings
    s = re.sub(r"\{[^}]*\}", " ", s)                        # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)                       # ranges
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
               r" \1 ", s)                                  # grouping labels
    s = re.sub(r"label_values\(([^,()]*),\s*\w+\s*\)", r"\1", s)  # its label
    s = re.sub(r"\$\{?\w+\}?", " ", s)                      # Grafana variables
    s = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?[smhdwy]?\b", " ", s)  # numbers
    words = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", s)
    return [w for w in words if w.lower() not in PROMQL_WORDS]


def dashboard_queries(doc):
    """(where, expr) of every panel target and templating query."""
    out = []

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(doc.get("panels", [])):
        for t in p.get("targets", []):
            out.append(("panel %r" % p.get("title"), t.get("expr", "")))
    for v in doc.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else q
            out.append(("variable %r" % v.get("name"), q or ""))
    return out


def unknown_names(doc, exported):
    errs = []
    for where, expr in dashboard_queries(doc):
        names = query_metrics(expr)
        if not names:
            errs.append("%s: query %r names no metric" % (where, expr))
        for n in names:
            if n not in exported:
                errs.append("%s: %s is not a metric keylane exports" % (where, n))
    return errs


# What the dashboard must show (issue 16): applied/s, duplicates, dead
# letters, fenced batches, lag in events and seconds, misrouted records,
# and the gateway's request rates and rejections.
REQUIRED = [
    "keylane_worker_events_applied_total",
    "keylane_worker_events_suppressed_total",
    "keylane_worker_dead_letters_total",
    "keylane_worker_fenced_batches_total",
    "kafka_consumergroup_lag",
    "keylane_worker_lag_seconds",
    "keylane_worker_misrouted_total",
    "keylane_gateway_requests_total",
    "keylane_gateway_rejected_total",
]
# Shown once the code exports it (the store commit's latency).
OPTIONAL = ["keylane_worker_event_commit_latency_seconds_bucket"]


def check_grafana(src, ok, bad):
    path = os.path.join(src, "deploy", "grafana", "keylane.json")
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        bad("deploy/grafana/keylane.json parses as JSON: %s" % e)
        return
    ok("deploy/grafana/keylane.json parses as JSON (%d panels)" % len(doc.get("panels", [])))
    exported = exported_metrics(src)
    if "keylane_worker_events_applied_total" not in exported:
        bad("grafana: the metric names read from the code lack "
            "keylane_worker_events_applied_total: the registration pattern "
            "no longer matches the code")
        return
    errs = unknown_names(doc, exported)
    n = len(dashboard_queries(doc))
    if errs:
        bad("grafana: %d queries name only metrics keylane exports: %s" % (n, "; ".join(errs)))
    else:
        ok("grafana: %d queries name only metrics keylane exports (%d names read from the code)"
           % (n, len(exported)))
    used = {m for _, e in dashboard_queries(doc) for m in query_metrics(e)}
    want = REQUIRED + [m for m in OPTIONAL if m in exported]
    missing = [m for m in want if m not in used]
    if missing:
        bad("grafana: the dashboard shows every metric it must: missing %s" % missing)
    else:
        ok("grafana: the dashboard shows applied/s, duplicates, dead letters, "
           "fenced batches, lag in events and seconds, misrouted records and "
           "the gateway's requests and rejections")
    # The check itself: a query naming a metric nobody exports is caught.
    probe = {"panels": [{"title": "probe", "targets": [
        {"expr": 'sum by (topic) (rate(keylane_worker_nope_total{topic="a"}[5m]))'}]}]}
    caught = unknown_names(probe, exported)
    if caught and "keylane_worker_nope_total" in caught[0]:
        ok("grafana: the check refuses a query naming a metric keylane does not export")
    else:
        bad("grafana: the check let keylane_worker_nope_total through: %s" % caught)


def check_alerts(src, ok, bad):
    """deploy/prometheus/alerts.yml: it parses, every rule has an alert name,
    an expression and a summary, every expression names only metrics keylane
    exports, and docs/operations.md says what to do about each alert."""
    import yaml

    path = os.path.join(src, "deploy", "prometheus", "alerts.yml")
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
        rules = [r for g in doc["groups"] for r in g["rules"]]
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:
        bad("deploy/prometheus/alerts.yml parses as alerting rules: %s" % e)
        return
    exported = exported_metrics(src)
    with open(os.path.join(src, "docs", "operations.md")) as f:
        ops = f.read()
    errs = []
    for r in rules:
        name = r.get("alert")
        expr = r.get("expr", "")
        if not name or not expr or not r.get("annotations", {}).get("summary"):
            errs.append("rule %r lacks alert, expr or summary" % r)
            continue
        names = query_metrics(expr)
        if not names:
            errs.append("%s: %r names no metric" % (name, expr))
        errs += ["%s: %s is not a metric keylane exports" % (name, n)
                 for n in names if n not in exported]
        if "`%s`" % name not in ops:
            errs.append("%s: docs/operations.md does not say what to do "
                        "about it" % name)
    if errs:
        bad("alerts: %d rules name only exported metrics and are in "
            "docs/operations.md: %s" % (len(rules), "; ".join(errs)))
    else:
        ok("alerts: %d rules name only metrics keylane exports, each "
           "explained in docs/operations.md" % len(rules))

