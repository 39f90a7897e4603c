"""The Publisher on librdkafka's in-process mock cluster: settings it
refuses, the partition it sets, ids, delivery reports, futures, and a
partition count that changes under it."""
import datetime
import time

import pytest

pytest.importorskip("confluent_kafka")

from keylane import ConfigError, DeliveryError, EventError, PartitionsChanged, Publisher  # noqa: E402
from keylane import envelope as env  # noqa: E402
from keylane.routing import partition  # noqa: E402


def mock_publisher(**kw):
    return Publisher(None, test_mock_num_brokers=1, **kw)


@pytest.mark.parametrize(
    "conf,says",
    [
        ({"partitioner": "consistent_random"}, "partitioner='consistent_random': keylane computes each event's partition itself"),
        ({"partitioner_cb": lambda *a: 0}, "partitioner_cb=<function"),
        ({"acks": 1}, "acks=1: keylane publishes with acks=all"),
        ({"request.required.acks": "0"}, "request.required.acks=0"),
        ({"enable_idempotence": False}, "enable.idempotence=False: keylane needs the idempotent producer"),
    ],
)
def test_refused_settings_say_why(conf, says):
    with pytest.raises(ConfigError) as e:
        Publisher("127.0.0.1:1", **conf)
    assert says in str(e.value)


def test_no_bootstrap_is_refused():
    with pytest.raises(ConfigError, match="no bootstrap servers"):
        Publisher()


def test_python_and_dotted_spellings_reach_librdkafka():
    with pytest.raises(ConfigError, match="No such configuration property"):
        Publisher("127.0.0.1:1", no_such_thing=1)
    Publisher("127.0.0.1:1", linger_ms=20, **{"batch.num.messages": 100}, error_cb=lambda e: None)


def test_publish_sets_keylanes_partition_and_returns_the_id():
    pub = mock_publisher()
    got = []
    keys = ["acct-%d" % i for i in range(300)]
    ids = [pub.publish("events", k, "credit", {"amount": 1}, on_delivery=got.append) for k in keys]
    pub.flush(30)
    assert len(got) == 300 and all(d.error is None and d.offset >= 0 for d in got)
    n = pub.partitions("events")
    assert n > 1
    by_id = {d.id: d for d in got}
    for key, event_id in zip(keys, ids):
        d = by_id[event_id]
        assert d.key == key.encode() and d.partition == partition(key, n)
        assert pub.partition_for("events", key) == d.partition


def test_given_ids_are_kept_and_reserved_ones_refused():
    pub = mock_publisher()
    assert pub.publish("events", "k", "t", b"", "order-17") == "order-17"
    with pytest.raises(EventError, match="begins with '~'"):
        pub.publish("events", "k", "t", b"", "~events/0/1/0")
    with pytest.raises(EventError, match="message has no key"):
        pub.publish("events", "", "t")
    with pytest.raises(EventError, match='envelope field "t" is empty'):
        pub.publish("events", "k", "")
    pub.flush(30)


def test_delayed_events_are_version_2_and_reserved_types_refused():
    pub = mock_publisher()
    sent = []
    produce = pub._produce

    def spy(topic, value, key, part, **kw):
        sent.append(value)
        produce(topic, value, key, part, **kw)

    pub._produce = spy
    before = int(time.time() * 1000)
    at_ms = before + 86400000  # a day ahead, a day back: within timer.max.delay
    at = datetime.datetime.fromtimestamp(at_ms / 1000, datetime.timezone.utc)
    ms = before - 86400000
    pub.publish("events", "k", "t", b"", "at", not_before=at)
    pub.publish("events", "k", "t", b"", "ms", not_before=ms)
    pub.publish("events", "k", "t", b"", "in", delay=datetime.timedelta(minutes=15))
    pub.send("events", "k", "t", b"", "sec", delay=60).result(30)
    pub.publish("events", "k", "t", b"", "now")
    after = int(time.time() * 1000)
    got = [env.decode(b"k", v) for v in sent]
    assert [e.id for e in got] == ["at", "ms", "in", "sec", "now"]
    assert got[0].not_before == at_ms and got[1].not_before == ms
    assert before + 900000 <= got[2].not_before <= after + 900000
    assert before + 60000 <= got[3].not_before <= after + 60000
    assert got[4].not_before == 0 and sent[4][3] == 1 and sent[0][3] == 2
    # the same bytes as the encoder everyone shares
    assert sent[1] == env.encode("ms", "t", got[1].ts, b"", None, ms)
    with pytest.raises(EventError, match="both not_before and delay are given"):
        pub.publish("events", "k", "t", not_before=1767225600000, delay=5)
    with pytest.raises(EventError, match="begins with '~', which keylane keeps for its own records"):
        pub.publish("events", "k", "~timer", not_before=1767225600000)
    with pytest.raises(EventError, match="begins with '~', which keylane keeps for its own records"):
        pub.publish("events", "k", "~x")  # the C path hands it back
    pub.flush(30)


@pytest.mark.parametrize(
    "when, says",
    [
        ({"delay": 7 * 86400 + 3600}, r"ms from now, .* more than timer.max.delay \(7d\) allows"),
        ({"not_before": -7 * 86400000 - 3600000}, r"ms in the past, .* more than timer.max.delay \(7d\) allows"),
        ({"not_before": 1767225600}, r"it looks like seconds; give milliseconds since the Unix epoch \(1767225600000 "),
        ({"delay": 3, "max": 2000}, r"more than timer.max.delay \(2s\) allows"),
    ],
)
def test_a_time_beyond_timer_max_delay_is_refused_as_kl_publish_refuses_it(when, says):
    pub = mock_publisher(timer_max_delay_ms=when.pop("max", 7 * 86400000))
    nb = when.get("not_before")
    if nb is not None and nb < 0:  # relative to now
        when["not_before"] = int(time.time() * 1000) + nb
    with pytest.raises(EventError, match=says):
        pub.publish("events", "k", "t", **when)
    pub.flush(30)


@pytest.mark.parametrize("bad", [999, 1.5, "7d"])
def test_timer_max_delay_ms_is_checked(bad):
    with pytest.raises(ConfigError, match="timer_max_delay_ms=.*at least 1000"):
        mock_publisher(timer_max_delay_ms=bad)


def test_send_returns_a_future_of_the_delivery():
    pub = mock_publisher()
    f = pub.send("events", b"acct-1", "credit", {"amount": 5}, headers={"origin": "test"})
    d = f.result(30)  # serves delivery reports itself: nobody else polls
    assert d.id == f.id and d.error is None and d.topic == "events"
    assert d.partition == partition(b"acct-1", pub.partitions("events"))


def test_publisher_on_delivery_sees_every_event_without_its_own():
    seen = []
    pub = mock_publisher(on_delivery=seen.append)
    for i in range(10):
        pub.publish("events", "k%d" % i, "t")
    pub.flush(30)
    assert len(seen) == 10 and {d.error for d in seen} == {None}
    assert all(len(d.id) == 36 for d in seen)


def test_given_id_ts_and_headers_are_delivered():
    pub = mock_publisher()
    seen = []
    pub.publish("events", "k", "credit", {"amount": 5}, "id-1", {"a": "b"}, ts=7, on_delivery=seen.append)
    pub.flush(30)
    assert seen[0].id == "id-1" and seen[0].error is None


def test_a_changed_partition_count_stops_publishing():
    pub = mock_publisher(partitions_check_ms=100)
    pub.publish("events", "k", "t")
    topic = pub._topics["events"]
    topic.live = topic.count + 2  # as the watch thread would read it
    with pytest.raises(PartitionsChanged, match=r"topic events has \d+ partitions now, \d+ when this publisher started"):
        pub.publish("events", "k", "t")
    pub.flush(30)


def test_expect_partitions_refuses_another_count():
    pub = mock_publisher(expect_partitions=3)
    with pytest.raises(PartitionsChanged, match=r"the fleet expects 3: keys would move between owners"):
        pub.publish("events", "k", "t")


def test_the_watch_thread_rereads_the_count():
    pub = mock_publisher(partitions_check_ms=100)
    pub.publish("events", "k", "t")
    topic = pub._topics["events"]
    topic.live = -1
    deadline = time.time() + 10
    while topic.live == -1 and time.time() < deadline:
        time.sleep(0.05)
    assert topic.live == topic.count
    pub.close()


def test_the_current_spans_trace_context_goes_in_the_headers():
    trace = pytest.importorskip("opentelemetry.trace")
    pub = mock_publisher()
    sent = []
    pub._produce = lambda topic, value, key, part, **kw: sent.append(value)
    ctx = trace.SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736, span_id=0x00F067AA0BA902B7, is_remote=False,
        trace_flags=trace.TraceFlags(1),
    )
    pub.publish("events", "k", "t")  # no current span: no headers
    with trace.use_span(trace.NonRecordingSpan(ctx)):
        pub.publish("events", "k", "t")
        pub.publish("events", "k", "t", headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-00"})
    from keylane import decode

    assert decode("k", sent[0]).headers == {}
    assert decode("k", sent[1]).headers == {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert decode("k", sent[2]).headers["traceparent"].startswith("00-111")  # the event's own wins


def test_payloads_raw_and_packed():
    pub = mock_publisher()
    sent = []
    pub._produce = lambda topic, value, key, part, **kw: sent.append(value)
    for payload in (b"\x01", bytearray(b"\x01"), memoryview(b"\x01"), {"a": 1}, "s", None, [1, 2.5]):
        pub.publish("events", "k", "t", payload)
    from keylane import decode

    got = [decode("k", v).payload for v in sent]
    assert got == [b"\x01"] * 3 + [b"\x81\xa1a\x01", b"\xa1s", b"\xc0", b"\x92\x01\xcb\x40\x04\x00\x00\x00\x00\x00\x00"]
    with pytest.raises(EventError, match="the payload cannot be packed as msgpack"):
        pub.publish("events", "k", "t", object())
    with pytest.raises(EventError, match='envelope field "p" is 1046529 bytes'):
        pub.publish("events", "k", "t", bytearray(1046529))


def test_a_failure_is_raised_by_flush():
    # a message.timeout.ms that has passed before the cluster answers
    pub = Publisher("127.0.0.1:1", message_timeout_ms=1, socket_connection_setup_timeout_ms=1000)
    pub._topics["events"] = __import__("keylane.publisher").publisher._Topic("events", 4, None)
    pub.publish("events", "k", "t", b"", "id-9")
    with pytest.raises(DeliveryError) as e:
        pub.flush(30)
    assert "id-9" in str(e.value) and e.value.failed[0].id == "id-9" and e.value.failed[0].offset == -1
