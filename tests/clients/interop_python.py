"""The Python side of tests/clients/test_clients_python.sh: the keylane
package (clients/python) against keylane's own binaries.

  interop_python.py keys OUT N SEED
      writes N distinct keys, one a line: ASCII and UTF-8, 1..200 bytes
  interop_python.py route KEYS PARTITIONS ROUTED
      keylane.partition() of each key equals `keylane route`'s (ROUTED)
  interop_python.py publish BOOTSTRAP TOPIC KEYS OUT
      publishes one event per key with keylane.Publisher; writes
      KEY<TAB>PARTITION as Kafka acknowledged it
  interop_python.py publish-lines KEYS OUT
      the same events as JSON lines for `keylane publish`
  interop_python.py same-bytes-lines OUT
      events at msgpack's width boundaries, delayed ones among them, as
      JSON lines for `keylane publish`
  interop_python.py same-bytes BOOTSTRAP TOPIC LINES PUBLISHED
      reads back each event `keylane publish` reported (PUBLISHED, its
      stdout) for the lines LINES and checks that keylane.envelope encodes
      the same event (its id, type, ts, payload, headers, not_before) to
      the very same bytes
  interop_python.py publish-delayed BOOTSTRAP TOPIC NOT_BEFORE
      publishes one event with not_before=NOT_BEFORE (ms) and one with
      delay=60 (s), keys "at" and "in", with the Publisher
  interop_python.py topic BOOTSTRAP TOPIC
      makes TOPIC on an embedded cluster (a metadata request creates it)
  interop_python.py ledger BOOTSTRAP TOPIC PREFIX KEYS EVENTS SEED OUT
      publishes ledger events (credit/debit {"amount", "seq"}) with the
      Publisher, some of them twice with the same id; writes the
      balances and seqs a worker must show to OUT
Each check exits 1 with the first differences on stderr.
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kafka"))

from interop import expected_of  # noqa: E402  (tests/kafka/interop.py)

import keylane  # noqa: E402
from keylane import envelope  # noqa: E402


def fail(what, diffs):
    print("%s: %s" % (what, "; ".join(diffs[:5])), file=sys.stderr)
    sys.exit(1)


def read_keys(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line[:-1] for line in f]


def cmd_keys(out, n, seed):
    rnd = random.Random(int(seed))
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@ é€中😀"
    keys = set()
    while len(keys) < int(n):
        size = rnd.choice((1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 24, 36, 64, 200))
        key = "".join(rnd.choice(alphabet) for _ in range(size)).strip() or "k"
        if len(key.encode()) <= envelope.KEY_MAX:
            keys.add(key)
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for key in sorted(keys):
            f.write(key + "\n")


def cmd_route(keys_path, partitions, routed_path):
    keys = read_keys(keys_path)
    with open(routed_path, encoding="utf-8", newline="\n") as f:
        routed = [line[:-1].rsplit("\t", 1) for line in f]
    diffs = []
    if [k for k, _ in routed] != keys:
        diffs.append("keylane route printed other keys")
    for (key, p) in routed:
        mine = keylane.partition(key, int(partitions))
        if mine != int(p):
            diffs.append("%r: keylane route %s, Python %d" % (key, p, mine))
    if diffs:
        fail("partitions differ", diffs)


def cmd_publish(bootstrap, topic, keys_path, out):
    keys = read_keys(keys_path)
    got = {}
    pub = keylane.Publisher(bootstrap, linger_ms=5)
    for i, key in enumerate(keys):
        pub.publish(topic, key, "credit", {"amount": i + 1}, on_delivery=lambda d: got.__setitem__(d.key, d))
    pub.close(60)
    bad = [d for d in got.values() if d.error is not None]
    if bad or len(got) != len(keys):
        fail("publish", ["%d of %d delivered" % (len(got) - len(bad), len(keys))] + [str(d) for d in bad])
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for key in keys:
            f.write("%s\t%d\n" % (key, got[key.encode()].partition))


def cmd_publish_lines(keys_path, out):
    with open(out, "w", encoding="utf-8") as f:
        for i, key in enumerate(read_keys(keys_path)):
            f.write(json.dumps({"key": key, "type": "credit", "payload": {"amount": i + 1}}) + "\n")


# Payloads at msgpack's width boundaries, as JSON: what `keylane publish`
# packs and keylane.envelope must pack alike.
SAME_BYTES_EVENTS = [
    {"key": "k1", "type": "credit", "id": "a", "payload": {"amount": 5, "seq": 1}},
    {"key": "k2", "type": "t" * 31, "id": "i" * 31, "payload": [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1]},
    {"key": "k3", "type": "t" * 32, "id": "i" * 32, "payload": [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]},
    {"key": "é€中", "type": "t" * 255, "id": "é" * 100, "payload": {"s": "x" * 40, "u": "😀", "f": 1.5, "n": None, "b": [True, False], "e": {}, "l": []}},
    {"key": "k5", "type": "big", "payload": {"s": "y" * 300, "t": "z" * 70000, "a": list(range(20)), "m": {str(i): i for i in range(20)}}},
    {"key": "k6", "type": "h", "payload": 3, "headers": {"origin": "test", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
    {"key": "k7", "type": "h16", "payload": "s", "headers": {"h%02d" % i: "v" * i for i in range(20)}},
    {"key": "k8", "type": "raw", "payload_b64": "AAEC/w=="},
    {"key": "k9", "type": "empty"},
]


def same_bytes_events():
    """SAME_BYTES_EVENTS and delayed ones (version 2, "nb" last): a day
    from now, within any maximum delay, once with headers."""
    nb = envelope.now_ms() + 86400000
    return SAME_BYTES_EVENTS + [
        {"key": "k10", "type": "later", "payload": {"amount": 1}, "not_before": nb},
        {"key": "k11", "type": "later", "payload": 2, "headers": {"origin": "test"}, "not_before": nb + 1},
    ]


def cmd_same_bytes_lines(out):
    with open(out, "w", encoding="utf-8") as f:
        for ev in same_bytes_events():
            f.write(json.dumps(ev) + "\n")


def cmd_same_bytes(bootstrap, topic, lines, published):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "same-bytes", "enable.auto.commit": False})
    diffs = []
    with open(lines) as f:
        wants = [json.loads(line) for line in f]
    with open(published) as f:
        reported = [json.loads(line) for line in f]
    if len(reported) != len(wants):
        fail("same bytes", ["keylane publish reported %d events of %d" % (len(reported), len(wants))])
    for want, r in zip(wants, reported):
        c.assign([TopicPartition(topic, r["partition"], r["offset"])])
        msg = c.poll(30)
        if msg is None or msg.error():
            diffs.append("%s: not read back (%s)" % (r["key"], msg and msg.error()))
            continue
        ev = envelope.decode(msg.key(), msg.value())
        if "payload_b64" in want:
            import base64

            payload = base64.b64decode(want["payload_b64"])
        else:
            payload = want.get("payload", b"")
        _, mine, _ = envelope.encode_event(
            want["key"], want["type"], payload, ev.id, want.get("headers"), ts=ev.ts, not_before=want.get("not_before")
        )
        if mine != msg.value():
            diffs.append("%s: Python %s, keylane publish %s" % (r["key"], mine[:80].hex(), msg.value()[:80].hex()))
        if ev.id != r["id"] or ("id" in want and ev.id != want["id"]):
            diffs.append("%s: id %s, reported %s" % (r["key"], ev.id, r["id"]))
        if envelope.pack_payload(payload) != ev.payload:
            diffs.append("%s: payload differs" % r["key"])
        if ev.not_before != want.get("not_before", 0):
            diffs.append("%s: not_before %d, given %s" % (r["key"], ev.not_before, want.get("not_before")))
    c.close()
    if diffs:
        fail("envelopes differ", diffs)


def cmd_publish_delayed(bootstrap, topic, not_before):
    pub = keylane.Publisher(bootstrap)
    pub.send(topic, "at", "later", {"n": 1}, not_before=int(not_before)).result(30)
    pub.send(topic, "in", "later", {"n": 2}, delay=60).result(30)
    pub.close(30)


def cmd_ledger(bootstrap, topic, prefix, keys, count, seed, out):
    rnd = random.Random(int(seed))
    seq = {}
    evs = []
    pub = keylane.Publisher(bootstrap)
    failed = []
    for i in range(int(count)):
        key = "%s%04d" % (prefix, rnd.randrange(int(keys)))
        seq[key] = seq.get(key, 0) + 1
        amount = rnd.randint(1, 1000)
        kind = "debit" if rnd.random() < 0.3 else "credit"
        event_id = "%s-%d" % (prefix, i)
        pub.publish(topic, key, kind, {"amount": amount, "seq": seq[key]}, event_id)
        if i % 10 == 0:  # published again with its id: applied once
            pub.publish(topic, key, kind, {"amount": amount, "seq": seq[key]}, event_id)
        evs.append((key, seq[key], kind, amount, None))
    pub.close(60)
    with open(out, "w") as f:
        json.dump(expected_of(evs), f)
    if failed:
        fail("ledger publish", failed)


def cmd_topic(bootstrap, topic):
    keylane.Publisher(bootstrap).partitions(topic)


COMMANDS = {
    "topic": cmd_topic,
    "keys": cmd_keys,
    "route": cmd_route,
    "publish": cmd_publish,
    "publish-lines": cmd_publish_lines,
    "same-bytes-lines": cmd_same_bytes_lines,
    "same-bytes": cmd_same_bytes,
    "publish-delayed": cmd_publish_delayed,
    "ledger": cmd_ledger,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](*sys.argv[2:])
