"""The other side of the interop test: Kafka clients and msgpack that
keylane did not write (kafka-python, msgpack from PyPI).

  interop.py create-topic BOOTSTRAP TOPIC PARTITIONS RF
  interop.py envelopes DIR PREFIX KEYS EVENTS SEED
      writes DIR/<key>/<seq>.bin, one msgpack envelope per file, for kcat
      to publish, and DIR/expected.json
  interop.py produce BOOTSTRAP TOPIC DIR PREFIX KEYS EVENTS SEED
      publishes the same kind of events with kafka-python's default
      (Java-compatible murmur2) partitioner; writes DIR/expected.json and
      DIR/placed.tsv (key, partition, offset as the broker acknowledged)
  interop.py check-envelope FILE ID
      FILE holds one message value keylane published: a valid v1 envelope
      whose id is ID
  interop.py merge OUT JSON...
      merges expected.json files into OUT
  interop.py compare EXPECTED LEDGER_JSON
      `keylane ledger --json` output matches EXPECTED exactly; exit 1 if not
"""
import json
import os
import random
import sys
import time
import uuid

import msgpack


def events(prefix, keys, count, seed):
    """Ledger events over `keys` keys, per-key seq from 1; 30 % debits."""
    rnd = random.Random(seed)
    seq = {}
    out = []
    for _ in range(count):
        key = "%s%04d" % (prefix, rnd.randrange(keys))
        seq[key] = seq.get(key, 0) + 1
        amount = rnd.randint(1, 1000)
        kind = "debit" if rnd.random() < 0.3 else "credit"
        payload = msgpack.packb({"amount": amount, "seq": seq[key]})
        envelope = {
            "v": 1,
            "id": str(uuid.uuid4()),
            "t": kind,
            "ts": int(time.time() * 1000),
            "p": payload,  # bytes: msgpack bin
            "h": {"origin": "interop.py"},
        }
        out.append((key, seq[key], kind, amount, msgpack.packb(envelope)))
    return out


def expected_of(evs):
    exp = {}
    for key, seq, kind, amount, _ in evs:
        e = exp.setdefault(key, {"balance": 0, "last_seq": 0})
        e["balance"] += amount if kind == "credit" else -amount
        e["last_seq"] = seq
    return exp


def cmd_create_topic(bootstrap, topic, partitions, rf):
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","))
    admin.create_topics([NewTopic(topic, int(partitions), int(rf))])
    admin.close()


def cmd_envelopes(directory, prefix, keys, count, seed):
    evs = events(prefix, int(keys), int(count), int(seed))
    for key, seq, _, _, value in evs:
        os.makedirs(os.path.join(directory, key), exist_ok=True)
        with open(os.path.join(directory, key, "%06d.bin" % seq), "wb") as f:
            f.write(value)
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected_of(evs), f)


def cmd_produce(bootstrap, topic, directory, prefix, keys, count, seed):
    from kafka import KafkaProducer

    evs = events(prefix, int(keys), int(count), int(seed))
    producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all")
    futures = [(key, producer.send(topic, key=key.encode(), value=value))
               for key, _, _, _, value in evs]
    producer.flush(30)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "placed.tsv"), "w") as f:
        for key, fut in futures:
            md = fut.get(timeout=30)
            f.write("%s\t%d\t%d\n" % (key, md.partition, md.offset))
    producer.close()
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected_of(evs), f)


def cmd_check_envelope(path, want_id):
    with open(path, "rb") as f:
        env = msgpack.unpackb(f.read(), raw=False)
    problems = []
    if env.get("v") != 1:
        problems.append("v is %r" % env.get("v"))
    if env.get("id") != want_id:
        problems.append("id is %r, keylane publish reported %r" % (env.get("id"), want_id))
    if not isinstance(env.get("p"), bytes):
        problems.append("p is not a bin")
    if not isinstance(env.get("ts"), int):
        problems.append("ts is not an int")
    if problems:
        print("%s: %s" % (path, "; ".join(problems)), file=sys.stderr)
        sys.exit(1)


def cmd_merge(out, *paths):
    merged = {}
    for p in paths:
        with open(p) as f:
            merged.update(json.load(f))
    with open(out, "w") as f:
        json.dump(merged, f)


def cmd_compare(expected_path, ledger_path):
    with open(expected_path) as f:
        exp = json.load(f)
    try:
        with open(ledger_path) as f:
            got = json.load(f)
    except (OSError, ValueError):
        sys.exit(1)
    balances = got.get("balances", got)
    have = {}
    for k, v in (balances.items() if isinstance(balances, dict) else []):
        have[k] = v
    if isinstance(balances, list):
        for row in balances:
            have[row["key"]] = row
    bad = []
    for key, e in exp.items():
        row = have.get(key)
        if row is None:
            bad.append("%s missing" % key)
        elif row.get("balance") != e["balance"] or row.get("last_seq") != e["last_seq"]:
            bad.append("%s: %s, want %s" % (key, row, e))
    if got.get("order_violations", 0):
        bad.append("%s order violations" % got["order_violations"])
    if bad:
        print("; ".join(bad[:5]), file=sys.stderr)
        sys.exit(1)


COMMANDS = {
    "create-topic": cmd_create_topic,
    "envelopes": cmd_envelopes,
    "produce": cmd_produce,
    "check-envelope": cmd_check_envelope,
    "merge": cmd_merge,
    "compare": cmd_compare,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](*sys.argv[2:])
