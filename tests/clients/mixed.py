"""The ledger run of test_clients_mixed.sh: C, Python, Go and the HTTP
gateway publish into one topic at once, each re-publishing some of its
own ids, then Python and the gateway re-publish ids the others published.

  mixed.py run BIN BOOTSTRAP GATEWAY GO_PROGRAM TOPIC DIR
      publishes it all and writes DIR/expected.json: the balances and seqs
      a worker must show. Each client has its own keys (a key's seqs come
      from one publisher, in order); 10 keys each.
"""
import json
import os
import random
import subprocess
import sys
import threading
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kafka"))

from interop import expected_of  # noqa: E402  (tests/kafka/interop.py)

import keylane  # noqa: E402

EVENTS = 300  # per client, before its own re-publishes


def ledger_events(prefix, seed):
    """[(key, seq, kind, amount, id)], every 10th followed by itself."""
    rnd = random.Random(seed)
    seq, out = {}, []
    for i in range(EVENTS):
        key = "%s%02d" % (prefix, rnd.randrange(10))
        seq[key] = seq.get(key, 0) + 1
        ev = (key, seq[key], "debit" if rnd.random() < 0.3 else "credit", rnd.randint(1, 1000), "%s%d" % (prefix, i))
        out.append(ev)
        if i % 10 == 0:
            out.append(ev)
    return out


def as_json(ev):
    key, seq, kind, amount, event_id = ev
    return {"key": key, "type": kind, "id": event_id, "payload": {"amount": amount, "seq": seq}}


def post(gateway, topic, events):
    """POSTs events to the gateway in batches of 50; each 200 means Kafka
    acknowledged the batch."""
    for i in range(0, len(events), 50):
        body = json.dumps([as_json(e) for e in events[i : i + 50]]).encode()
        req = urllib.request.Request(
            "http://%s/v1/topics/%s/events" % (gateway, topic), body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            if resp.status != 200:
                raise RuntimeError("gateway answered %d" % resp.status)


def publish_py(pub, topic, events):
    for key, seq, kind, amount, event_id in events:
        pub.publish(topic, key, kind, {"amount": amount, "seq": seq}, event_id)


def distinct(events):
    seen, out = set(), []
    for e in events:
        if e[4] not in seen:
            seen.add(e[4])
            out.append(e)
    return out


def cmd_run(bin_path, bootstrap, gateway, go_program, topic, directory):
    c_events = ledger_events("c-", 1)
    py_events = ledger_events("py-", 2)
    gw_events = ledger_events("gw-", 3)
    c_lines = os.path.join(directory, "c.jsonl")
    with open(c_lines, "w") as f:
        for e in c_events:
            f.write(json.dumps(as_json(e)) + "\n")
    # ---- all four at once
    with open(c_lines) as stdin, open(os.path.join(directory, "c-published.jsonl"), "w") as stdout:
        c_run = subprocess.Popen([bin_path, "publish", "-b", bootstrap, "-t", topic], stdin=stdin, stdout=stdout)
    go_expected = os.path.join(directory, "go-expected.json")
    go_run = subprocess.Popen([go_program, "ledger", bootstrap, topic, "go-", "10", str(EVENTS), "4", go_expected])
    errors = []

    def gateway_side():
        try:
            post(gateway, topic, gw_events)
        except Exception as e:  # reported below
            errors.append("gateway: %s" % e)

    gw_thread = threading.Thread(target=gateway_side)
    gw_thread.start()
    pub = keylane.Publisher(bootstrap)
    publish_py(pub, topic, py_events)
    pub.flush(60)
    gw_thread.join()
    if c_run.wait(120) != 0 or go_run.wait(120) != 0:
        errors.append("keylane publish exited %s, the Go publisher %s" % (c_run.returncode, go_run.returncode))
    if errors:
        sys.exit("; ".join(errors))
    # ---- ids another client published, again: applied once
    publish_py(pub, topic, distinct(c_events)[100:130])
    pub.flush(60)
    post(gateway, topic, distinct(py_events)[100:130])
    # then one more event on each of those keys, from Python: once the
    # worker shows it, it has read the re-published ids before it
    tail = []
    last = {}
    for key, seq, _, _, _ in c_events + py_events:
        last[key] = max(seq, last.get(key, 0))
    for e in distinct(c_events)[100:130] + distinct(py_events)[100:130]:
        key = e[0]
        if key not in {t[0] for t in tail}:
            last[key] += 1
            tail.append((key, last[key], "credit", 1, "tail-%s" % key))
    publish_py(pub, topic, tail)
    pub.close(60)
    exp = expected_of([(k, s, kind, a, None) for k, s, kind, a, _ in distinct(c_events) + distinct(py_events) + distinct(gw_events) + tail])
    with open(go_expected) as f:
        exp.update(json.load(f))
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(exp, f)
    print(
        "published: C %d, Python %d, Go %d (+%d twice), gateway %d events; then 60 ids again across clients and %d tails"
        % (len(c_events), len(py_events), EVENTS, EVENTS // 10, len(gw_events), len(tail))
    )


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "run":
        sys.exit(__doc__)
    cmd_run(*sys.argv[2:])
