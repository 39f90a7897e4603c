"""Throughput of the keylane Python package (tests/bench/clients/bench_clients.sh).

  bench_clients.py publish KEYLANE_BIN EVENTS ROUNDS
      events/s of the Publisher against bare confluent-kafka producing the
      same bytes (the same keys, envelopes and partitions), each run with a
      producer and an embedded cluster of its own (the mock cluster keeps
      every record in memory, and slows down as it fills), the runs
      interleaved ROUNDS times (median)
  bench_clients.py load BOOTSTRAP TOPIC EVENTS
      publishes EVENTS ledger events (1,000 keys) for the handler runs
  bench_clients.py requests EVENTS OUT
      EVENTS request lines as keylane's exec handler writes them
  bench_clients.py handler-script KIND OUT
      writes the ledger-like handler KIND (helper: on keylane.handler;
      hand: the hand-written loop of today) to OUT; it is run as
      `python3 OUT EVENTS RESULT` and writes its elapsed seconds, from its
      first event to its EVENTS-th, to RESULT
"""
import json
import statistics
import subprocess
import sys
import time

KEYS = 1000


def ledger(events):
    """[(key, type, payload, id)] of a ledger workload over KEYS keys."""
    seq = {}
    out = []
    for i in range(events):
        key = "acct-%04d" % ((i * 7919) % KEYS)
        seq[key] = seq.get(key, 0) + 1
        kind = "debit" if i % 10 < 3 else "credit"
        out.append((key, kind, {"amount": i % 1000 + 1, "seq": seq[key]}, "bench-%d" % i))
    return out


def full(p, topic, value, key):
    """librdkafka's queue is full: serve delivery reports until it has room."""
    while True:
        p.poll(0.01)
        try:
            return p.produce(topic, value, key)
        except BufferError:
            pass


def run_bare_prebuilt(bootstrap, topic, evs, values):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "enable.idempotence": True, "acks": "all"})
    p.list_topics(topic, timeout=10)
    produce = p.produce
    t = time.perf_counter()
    for (key, _, _, _), value in zip(evs, values):
        try:
            produce(topic, value, key)
        except BufferError:
            full(p, topic, value, key)
    p.flush(120)
    return time.perf_counter() - t


def run_bare_encoding(bootstrap, topic, evs, ts):
    import msgpack
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "enable.idempotence": True, "acks": "all"})
    p.list_topics(topic, timeout=10)
    produce, packb = p.produce, msgpack.packb
    t = time.perf_counter()
    for key, kind, payload, event_id in evs:
        value = packb({"v": 1, "id": event_id, "t": kind, "ts": ts, "p": packb(payload)})
        try:
            produce(topic, value, key)
        except BufferError:
            full(p, topic, value, key)
    p.flush(120)
    return time.perf_counter() - t


def run_publisher(bootstrap, topic, evs, ts, with_ids):
    import keylane

    pub = keylane.Publisher(bootstrap)
    pub.partitions(topic)
    publish = pub.publish
    t = time.perf_counter()
    if with_ids:
        for key, kind, payload, event_id in evs:
            publish(topic, key, kind, payload, event_id, ts=ts)
    else:
        for key, kind, payload, _ in evs:
            publish(topic, key, kind, payload)
    pub.flush(120)
    took = time.perf_counter() - t
    pub.close()
    return took


def on_fresh_cluster(bin_path, run):
    """Runs run(bootstrap, topic) on a new embedded cluster with topic
    "bench" of 16 partitions."""
    broker = subprocess.Popen(
        [bin_path, "broker", "--embedded", "-t", "bench", "--partitions", "16", "--brokers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        line = broker.stdout.readline().decode()
        return run(line.strip().split("=", 1)[1], "bench")
    finally:
        broker.kill()
        broker.wait()


def cmd_publish(bin_path, events, rounds):
    import keylane

    n = int(events)
    ts = int(time.time() * 1000)
    evs = ledger(n)
    # The same bytes: what the Publisher writes for these events.
    values = [keylane.encode_event(k, t, p, i, ts=ts)[1] for k, t, p, i in evs]
    import msgpack

    assert values[0] == msgpack.packb({"v": 1, "id": evs[0][3], "t": evs[0][1], "ts": ts, "p": msgpack.packb(evs[0][2])})
    evs = [(k.encode(), t, p, i) for k, t, p, i in evs]
    runs = {
        "bare confluent-kafka, envelopes prebuilt": lambda b, t: run_bare_prebuilt(b, t, evs, values),
        "bare confluent-kafka, msgpack per event": lambda b, t: run_bare_encoding(b, t, evs, ts),
        "Publisher.publish(..., id)": lambda b, t: run_publisher(b, t, evs, ts, True),
        "Publisher.publish() making ids": lambda b, t: run_publisher(b, t, evs, ts, False),
    }
    times = {name: [] for name in runs}
    for _ in range(int(rounds)):
        for name, run in runs.items():
            times[name].append(on_fresh_cluster(bin_path, run))
    eps = {name: n / statistics.median(t) for name, t in times.items()}
    names = list(runs)
    try:
        import opentelemetry.trace  # noqa: F401

        otel = "opentelemetry-api installed (the publisher looks up the current span)"
    except ImportError:
        otel = "no opentelemetry-api"
    print("publish: %d ledger events (%d keys, ~%d-byte envelopes), median of %s rounds, embedded cluster, %s"
          % (n, KEYS, len(values[0]), rounds, otel))
    for name in names:
        print("  %-50s %9.0f events/s" % (name, eps[name]))
    print("  ratio Publisher (ids given) / bare, msgpack per event: %.2f" % (eps[names[2]] / eps[names[1]]))
    print("  ratio Publisher (ids given) / bare, envelopes prebuilt: %.2f" % (eps[names[2]] / eps[names[0]]))
    print("  ratio Publisher (making ids) / bare, envelopes prebuilt: %.2f" % (eps[names[3]] / eps[names[0]]))


def cmd_load(bootstrap, topic, events):
    import keylane

    pub = keylane.Publisher(bootstrap)
    for key, kind, payload, event_id in ledger(int(events)):
        pub.publish(topic, key, kind, payload, event_id)
    pub.close(120)


def cmd_requests(events, out):
    with open(out, "w") as f:
        for i, (key, kind, payload, event_id) in enumerate(ledger(int(events))):
            r = {"seq": i + 1, "topic": "bench", "key": key, "id": event_id, "type": kind, "ts": 1700000000000,
                 "partition": i % 16, "offset": i, "epoch": 1, "payload": payload}
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


HELPER = '''import sys, time
from keylane.handler import handler, Fail
N, RESULT = int(sys.argv[1]), sys.argv[2]
balances, last_seq = {}, {}
state = {"count": 0, "t0": None}

@handler
def apply(event, tx):
    if state["t0"] is None:
        state["t0"] = time.monotonic()
    p = event.payload
    amount = p["amount"]
    if event.type == "debit":
        amount = -amount
    elif event.type != "credit":
        raise Fail("unknown type " + event.type)
    key = event.key
    balances[key] = balances.get(key, 0) + amount
    last_seq[key] = p["seq"]
    state["count"] += 1
    if state["count"] == N:
        with open(RESULT, "w") as f:
            f.write("%f\\n" % (time.monotonic() - state["t0"]))

apply.run()
'''

HAND = '''import json, sys, time
N, RESULT = int(sys.argv[1]), sys.argv[2]
balances, last_seq = {}, {}
count, t0 = 0, None
for line in sys.stdin:
    r = json.loads(line)
    if t0 is None:
        t0 = time.monotonic()
    p = r["payload"]
    amount = p["amount"]
    if r["type"] == "debit":
        amount = -amount
    key = r["key"]
    balances[key] = balances.get(key, 0) + amount
    last_seq[key] = p["seq"]
    count += 1
    if count == N:
        with open(RESULT, "w") as f:
            f.write("%f\\n" % (time.monotonic() - t0))
    sys.stdout.write(json.dumps({"seq": r["seq"], "status": "ok"}) + "\\n")
    sys.stdout.flush()
'''


def cmd_handler_script(kind, out):
    with open(out, "w") as f:
        f.write({"helper": HELPER, "hand": HAND}[kind])


COMMANDS = {
    "publish": cmd_publish,
    "load": cmd_load,
    "requests": cmd_requests,
    "handler-script": cmd_handler_script,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](*sys.argv[2:])
