"""The handler test's events and verdict (tests/clients/test_clients_*.sh),
the same for every language's handler (handler_py.py, handler_go).

  handlers.py publish BOOTSTRAP TOPIC EXPECTED
      publishes 400 events over 20 keys with keylane.Publisher: credits,
      debits, 20 transfers (each emits a credit to another key), 5 that
      fail, 5 that ask for a retry once, 5 that raise once; before them 4
      credits delayed by 30 s, and after them 3 "cancel" events, each
      naming one of those credits of its key (the handler cancels its
      timer); writes what must come out to EXPECTED
  handlers.py verify EXPECTED LOG BOOTSTRAP DLQ
      the handler's effects (LOG, one per event id) give EXPECTED's
      balances; every event but the failed ones was applied, and each
      transfer's follow-up once, with an id keylane derived ("~...");
      DLQ holds exactly the failed events, with the handler's reason; the
      delayed credit not cancelled ran, the cancelled ones never did.
Prints what it checked; exits 1 with the differences.
"""
import json
import random
import sys

import keylane


def cmd_publish(bootstrap, topic, out):
    rnd = random.Random(29)
    keys = ["h-%02d" % i for i in range(20)]
    balances = {k: 0 for k in keys}
    applied, failed, transfers = [], [], 0
    special = ["fail"] * 5 + ["retry"] * 5 + ["raise"] * 5 + ["transfer"] * 20
    kinds = special + ["credit"] * 250 + ["debit"] * (400 - 250 - len(special))
    rnd.shuffle(kinds)
    pub = keylane.Publisher(bootstrap)
    # Delayed well past the worker's start, so that each is a timer when
    # its cancel comes; the kept one comes last, so that once it ran the
    # cancelled ones would have too.
    later = [("h-%02d" % i, "later-%d" % i) for i in range(4)]
    for n, (key, event_id) in enumerate(later):
        pub.publish(topic, key, "credit", {"amount": 1000}, event_id, delay=30 + 6 * (n == 3))
    balances[later[3][0]] += 1000
    applied.append(later[3][1])
    for i, kind in enumerate(kinds):
        key = rnd.choice(keys)
        amount = rnd.randint(1, 100)
        payload = {"amount": amount}
        event_id = "ev-%03d" % i
        if kind == "transfer":
            to = rnd.choice([k for k in keys if k != key])
            payload["to"] = to
            balances[to] += amount
            transfers += 1
        if kind == "fail":
            failed.append(event_id)
        else:
            applied.append(event_id)
            balances[key] += -amount if kind in ("debit", "transfer") else amount
        pub.publish(topic, key, kind, payload, event_id)
    for key, event_id in later[:3]:
        pub.publish(topic, key, "cancel", {"id": event_id}, "cancel-" + event_id)
    pub.close(60)
    with open(out, "w") as f:
        json.dump(
            {"balances": balances, "applied": applied, "failed": failed, "transfers": transfers,
             "cancelled": [i for _, i in later[:3]]},
            f,
        )


def dead_letters(bootstrap, dlq, want):
    from confluent_kafka import Consumer

    # No commit: verify runs again until the worker is done, and each run
    # must read every letter from the start, not after the last run's.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify-dlq", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([dlq])
    letters = {}
    for _ in range(300):
        msg = c.poll(0.2)
        if msg is not None and not msg.error():
            h = dict(msg.headers() or [])
            ev = keylane.decode(msg.key(), msg.value())
            letters[ev.id] = h.get("keylane.dlq.error", b"").decode()
        if len(letters) >= want and msg is None:
            break
    c.close()
    return letters


def cmd_verify(expected_path, log_path, bootstrap, dlq):
    with open(expected_path) as f:
        exp = json.load(f)
    effects = {}
    problems = []
    with open(log_path) as f:
        for line in f:
            e = json.loads(line)
            if e["id"] in effects and effects[e["id"]] != e:
                problems.append("id %s had two different effects" % e["id"])
            effects[e["id"]] = e
    balances = {k: 0 for k in exp["balances"]}
    for e in effects.values():
        balances[e["key"]] = balances.get(e["key"], 0) + e["delta"]
    if balances != exp["balances"]:
        diff = ["%s: %s, want %s" % (k, balances.get(k), v) for k, v in exp["balances"].items() if balances.get(k) != v]
        problems.append("balances differ: " + ", ".join(diff[:5]))
    fired = sorted(set(exp["cancelled"]) & set(effects))
    if fired:
        problems.append("cancelled timers ran: %s" % fired)
    follow = [i for i in effects if i.startswith("~")]
    direct = sorted(i for i in effects if not i.startswith("~"))
    if direct != sorted(exp["applied"]):
        problems.append("applied %d events, want %d" % (len(direct), len(exp["applied"])))
    if len(follow) != exp["transfers"]:
        problems.append("%d follow-ups applied, want %d" % (len(follow), exp["transfers"]))
    letters = dead_letters(bootstrap, dlq, len(exp["failed"]))
    if sorted(letters) != sorted(exp["failed"]):
        problems.append("dead letters %s, want %s" % (sorted(letters), sorted(exp["failed"])))
    bad = [i for i, why in letters.items() if "refused " + i not in why]
    if bad:
        problems.append("dead letters without the handler's reason: %s" % bad)
    if problems:
        print("; ".join(problems), file=sys.stderr)
        sys.exit(1)
    print(
        "%d events applied once, %d follow-ups, %d dead letters with their reasons, "
        "%d timers cancelled, balances exact" % (len(direct), len(follow), len(letters), len(exp["cancelled"]))
    )


COMMANDS = {"publish": cmd_publish, "verify": cmd_verify}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](*sys.argv[2:])
