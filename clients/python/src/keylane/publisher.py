"""Publishing events to keylane from Python: the Publisher.

It is a confluent-kafka (librdkafka) idempotent producer with acks=all
that routes every event itself: the partition is computed here, murmur2
as keylane's C producer and the Java client compute it, and set on each
record, so that no partitioner setting can send a key to a worker that
does not own it. A conf that names a partitioner is refused.

Threads: publish() and send() may be called from any thread. Delivery
callbacks run on the thread that calls poll(), flush(), or publish() (which
serves them now and then, and whenever librdkafka's queue is full). A
daemon thread of the publisher's own re-reads the partition count of each
topic in use every ``partitions_check_ms``; once a count differs from the
one the topic's keys were routed by, every publish to it raises
PartitionsChanged.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from confluent_kafka import KafkaError, KafkaException, Producer

from keylane import envelope as _env
from keylane.envelope import PAYLOAD_MAX, RECORD_MAX
from keylane.errors import ConfigError, DeliveryError, PartitionsChanged, PublishError
from keylane.routing import murmur2

try:  # the publish path in C (keylane/_speedups.c), when it was built
    from keylane._speedups import encode as _encode
except ImportError:  # pragma: no cover - depends on the build
    _encode = None

try:  # trace context from the current span, when OpenTelemetry is there
    from opentelemetry.trace import get_current_span as _current_span
except ImportError:  # pragma: no cover - depends on what is installed
    _current_span = None

#: confluent-kafka's own conf keys that take Python objects: kept as given.
_PY_KEYS = frozenset(("error_cb", "throttle_cb", "stats_cb", "oauth_cb", "logger", "on_delivery", "partitioner_cb"))
_packb = _env._packb
#: How long the first publish to a topic waits for its partition count.
_METADATA_TIMEOUT = 10.0
#: How many keys' partitions each topic remembers.
_ROUTE_CACHE = 65536


class Delivery:
    """What Kafka said about one event: ``error`` is None once it was
    acknowledged (``offset`` then says where it is), else librdkafka's
    reason (``offset`` -1)."""

    __slots__ = ("topic", "partition", "offset", "id", "key", "error")

    def __init__(self, topic: str, partition: int, offset: int, event_id: str, key: bytes, error: Optional[str]):
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.id = event_id
        self.key = key
        self.error = error

    def __repr__(self) -> str:
        state = "offset=%d" % self.offset if self.error is None else "error=%r" % self.error
        return "Delivery(topic=%r, partition=%d, %s, id=%r, key=%r)" % (
            self.topic,
            self.partition,
            state,
            self.id,
            self.key,
        )


def _delivery(msg: Any, err: Optional[KafkaError], event_id: Optional[str] = None) -> Delivery:
    if event_id is None:
        try:
            event_id = _env.decode(msg.key(), msg.value()).id
        except Exception:  # another encoder's bytes: the report still counts
            event_id = ""
    return Delivery(
        msg.topic(),
        msg.partition(),
        msg.offset() if err is None else -1,
        event_id,
        msg.key(),
        None if err is None else str(err),
    )


class DeliveryFuture(concurrent.futures.Future):
    """The future send() returns: its result is the Delivery, or it raises
    DeliveryError. result() and exception() serve the publisher's delivery
    reports while they wait, so no other thread has to poll."""

    def __init__(self, publisher: "Publisher", event_id: str):
        super().__init__()
        self._publisher = publisher
        #: the event's idempotency id, known before it is delivered
        self.id = event_id

    def _wait(self, timeout: Optional[float]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                return
            self._publisher.poll(left)

    def result(self, timeout: Optional[float] = None) -> Delivery:
        self._wait(timeout)
        return super().result(0 if self.done() else timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._wait(timeout)
        return super().exception(0 if self.done() else timeout)


class _Topic:
    """A topic in use: the count its keys are routed by, the count it
    must have, and the live count the watch thread last read."""

    __slots__ = ("name", "count", "expect", "configured", "live", "route")

    def __init__(self, name: str, count: int, expect: Optional[int]):
        self.name = name
        self.count = count
        self.expect = expect if expect else count
        self.configured = bool(expect)
        self.live = count
        self.route: Dict[bytes, int] = {}

    def refusal(self) -> str:
        if self.configured:
            return (
                "topic %s has %d partitions, the fleet expects %d: keys would move between owners; "
                "recreate the topic or pass expect_partitions=%d; nothing was published"
                % (self.name, self.live, self.expect, self.live)
            )
        return (
            "topic %s has %d partitions now, %d when this publisher started: keys moved between owners, "
            "and two workers could own one key; stop its producers, let the workers drain it, then "
            "restart the fleet with --partitions %d (expect_partitions=%d); nothing was published"
            % (self.name, self.live, self.expect, self.live, self.live)
        )


def _conf_name(name: str) -> str:
    """librdkafka's name of a setting given in Python spelling."""
    return name if "." in name or name in _PY_KEYS else name.replace("_", ".")


def _forced(conf: Dict[str, Any]) -> None:
    """Refuses a conf that would break what keylane rests on."""
    for name in ("partitioner", "partitioner_cb", "topic.partitioner"):
        if name in conf:
            raise ConfigError(
                "%s=%r: keylane computes each event's partition itself (murmur2, as keylane's C producer "
                "and the Java client do) and sets it on the record, so that a key always reaches the worker "
                "that owns it; a partitioner would never be used: remove it" % (name, conf[name])
            )
    for name in ("acks", "request.required.acks"):
        if name in conf and str(conf[name]) not in ("all", "-1"):
            raise ConfigError(
                "%s=%s: keylane publishes with acks=all so that no acknowledged event is lost; remove it"
                % (name, conf[name])
            )
    idem = conf.get("enable.idempotence")
    if idem is not None and str(idem).lower() != "true":
        raise ConfigError(
            "enable.idempotence=%s: keylane needs the idempotent producer (no duplicates or reordering on "
            "retry); remove it" % idem
        )


class Publisher:
    """Publishes events to keylane topics.

    ``Publisher("127.0.0.1:9092", linger_ms=5)``: ``conf`` is librdkafka
    properties in Python spelling (``linger_ms``) or dotted
    (``**{"linger.ms": 5}``); keylane forces enable.idempotence=true and
    acks=all and refuses a partitioner. ``expect_partitions`` refuses to
    publish to a topic with another partition count (without it, the count
    at a topic's first publish is the expected one);
    ``partitions_check_ms`` is how often the counts are read again;
    ``enqueue_timeout_ms`` how long publish() waits for room when
    librdkafka's queue is full; ``timer_max_delay_ms`` is the workers'
    timer.max.delay (7 days), which bounds a not_before ahead of now and
    behind it, as kl_publish() does; ``on_delivery`` is called with the
    Delivery of every event that has no callback of its own.
    """

    def __init__(
        self,
        bootstrap: Optional[str] = None,
        *,
        expect_partitions: Optional[int] = None,
        partitions_check_ms: int = 10000,
        enqueue_timeout_ms: int = 5000,
        timer_max_delay_ms: int = _env.TIMER_MAX_DELAY_MS,
        on_delivery: Optional[Callable[[Delivery], None]] = None,
        **conf: Any,
    ):
        rk: Dict[str, Any] = {_conf_name(k): v for k, v in conf.items()}
        _forced(rk)
        if bootstrap:
            rk["bootstrap.servers"] = bootstrap
        if not any(k in rk for k in ("bootstrap.servers", "metadata.broker.list", "test.mock.num.brokers")):
            raise ConfigError("no bootstrap servers: give the brokers as HOST:PORT[,HOST:PORT], e.g. Publisher(\"127.0.0.1:9092\")")
        if expect_partitions is not None and not 1 <= expect_partitions <= 100000:
            raise ConfigError("expect_partitions=%d: a topic has 1..100000 partitions" % expect_partitions)
        if not 100 <= partitions_check_ms <= 3600000:
            raise ConfigError("partitions_check_ms=%d: give 100..3600000" % partitions_check_ms)
        if type(timer_max_delay_ms) is not int or timer_max_delay_ms < 1000:
            raise ConfigError(
                "timer_max_delay_ms=%r: give the workers' timer.max.delay in ms, at least 1000 (1s)"
                % (timer_max_delay_ms,)
            )
        rk["enable.idempotence"] = True
        rk["acks"] = "all"
        rk.setdefault("message.max.bytes", _env.MESSAGE_MAX)
        self._user_error_cb = rk.pop("error_cb", None)
        self._user_dr = on_delivery
        rk["error_cb"] = self._error
        rk["on_delivery"] = self._dr
        try:
            self._rk = Producer(rk)
        except KafkaException as e:
            raise ConfigError("cannot create the Kafka producer: %s" % e.args[0].str()) from None
        self._expect = expect_partitions
        self._check_s = partitions_check_ms / 1000.0
        self._enqueue_s = enqueue_timeout_ms / 1000.0
        self._timer_max_ms = timer_max_delay_ms
        self._topics: Dict[str, _Topic] = {}
        self._lock = threading.Lock()  # topics added; the watch thread
        self._failed: list = []
        self._fatal: Optional[str] = None
        self._stop = threading.Event()
        self._watch: Optional[threading.Thread] = None
        self._produce = self._rk.produce

    # ---- callbacks, on the thread that polls ----

    def _error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = str(err)
        if self._user_error_cb is not None:
            self._user_error_cb(err)

    def _dr(self, err: Optional[KafkaError], msg: Any) -> None:
        if err is None and self._user_dr is None:
            return
        d = _delivery(msg, err)
        if err is not None:
            self._failed.append(d)
        if self._user_dr is not None:
            self._user_dr(d)

    # ---- topics and their partition counts ----

    def _read_count(self, name: str, timeout: float) -> int:
        """The partition count of ``name``; 0 while it has no leaders yet."""
        try:
            md = self._rk.list_topics(name, timeout=timeout)
        except KafkaException as e:
            raise PublishError("cannot read the partition count of topic %s: %s" % (name, e.args[0].str())) from None
        t = md.topics.get(name)
        if t is None:
            raise PublishError("metadata for topic %s came back empty" % name)
        if t.error is not None:
            if t.error.code() in (KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART):
                return 0
            raise PublishError("topic %s: %s" % (name, t.error.str()))
        return len(t.partitions)

    def _topic_load(self, name: str) -> _Topic:
        if not isinstance(name, str) or not name:
            raise PublishError("the topic is %r: give a topic name" % (name,))
        deadline = time.monotonic() + _METADATA_TIMEOUT
        while True:
            count = self._read_count(name, max(0.1, deadline - time.monotonic()))
            if count > 0:
                break
            if time.monotonic() >= deadline:
                raise PublishError(
                    "topic %s has no partition leaders after %d ms: does it exist?" % (name, _METADATA_TIMEOUT * 1000)
                )
            time.sleep(0.1)
        with self._lock:
            topic = self._topics.get(name)
            if topic is None:
                topic = self._topics[name] = _Topic(name, count, self._expect)
            if self._watch is None:
                self._watch = threading.Thread(target=self._watch_main, name="keylane-partitions", daemon=True)
                self._watch.start()
        return topic

    def _watch_main(self) -> None:
        while not self._stop.wait(self._check_s):
            with self._lock:
                topics = list(self._topics.values())
            for topic in topics:
                try:
                    count = self._read_count(topic.name, 5.0)
                except PublishError:
                    continue  # Kafka did not answer this time
                if count > 0:
                    topic.live = count

    def partitions(self, topic: str) -> int:
        """The live partition count of ``topic`` (read on first use)."""
        t = self._topics.get(topic) or self._topic_load(topic)
        return t.live

    def partition_for(self, topic: str, key: _env.Key) -> int:
        """The partition an event of ``key`` goes to on ``topic``."""
        t = self._topics.get(topic) or self._topic_load(topic)
        return (murmur2(_env.key_bytes(key)) & 0x7FFFFFFF) % t.count

    # ---- publishing ----

    def publish(
        self,
        topic: str,
        key: _env.Key,
        type: str,
        payload: Any = b"",
        id: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        *,
        ts: Optional[int] = None,
        not_before: Union[int, datetime.datetime, None] = None,
        delay: Union[int, float, datetime.timedelta, None] = None,
        on_delivery: Optional[Callable[[Delivery], None]] = None,
    ) -> str:
        """Publishes one event and returns its idempotency id (made, a
        UUIDv7, when ``id`` is None). ``payload`` is bytes, taken as they
        are, or any msgpack-serialisable value (a dict is packed as
        `keylane publish` packs a JSON payload). ``not_before`` (ms since
        the Unix epoch, or an aware datetime) or ``delay`` (seconds, or a
        timedelta, from now), not both, delay the event: the worker applies
        it, in its key's order, once that time has come. Raises EventError
        for an event kl_publish() would refuse (nothing is sent),
        PartitionsChanged, or PublishError when librdkafka's queue stays
        full for enqueue_timeout_ms. Returns once the event is queued:
        ``on_delivery`` (or the publisher's) gets its Delivery, and
        flush() raises DeliveryError for failures nobody was told of."""
        t = self._topics.get(topic) or self._topic_load(topic)
        if t.live != t.expect:
            raise PartitionsChanged(t.refusal())
        if self._fatal is not None:
            raise PublishError("the producer failed: %s; no further event can be published by it" % self._fatal)
        k = key if key.__class__ is bytes else _env.key_bytes(key)
        nb = 0 if not_before is None and delay is None else _env.not_before_ms(not_before, delay)
        if ts is None:  # one clock read for both, as kl_publish()
            ts = time.time_ns() // 1000000
            if id is None:
                id = _env._ids.make(ts)
        elif id is None:
            id = _env._ids.make()
        if payload.__class__ is not bytes:
            if isinstance(payload, (bytearray, memoryview)):
                payload = bytes(payload)
            else:
                try:
                    payload = _packb(payload)
                except Exception:
                    payload = _env.pack_payload(payload)  # raises, saying why
        if headers:
            headers = self._headers(headers)
        elif _current_span is not None:
            span = _current_span().get_span_context()
            if span.is_valid:
                headers = _trace_headers(None, span)
        encoded = None if headers or nb or _encode is None else _encode(k, type, id, ts, payload, t.count)
        if encoded is None:  # the rules in Python: raises what C refused
            id, value, part = self._encode(t, k, type, id, ts, payload, headers, nb)
        else:
            value, part = encoded
        try:
            if on_delivery is None:
                self._produce(topic, value, k, part)
            else:
                self._produce(topic, value, k, part, on_delivery=_callback(on_delivery, id))
        except BufferError:
            self._enqueue_wait(topic, value, k, part, on_delivery and _callback(on_delivery, id))
        return id

    def _encode(
        self,
        t: _Topic,
        k: bytes,
        type: Any,
        id: Any,
        ts: Any,
        payload: bytes,
        headers: Optional[Dict[str, str]],
        nb: int = 0,
    ) -> Tuple[str, bytes, int]:
        """The checks kl_publish() makes, the envelope and the partition,
        in Python: (id, envelope, partition)."""
        k = _env.key_bytes(k)
        type = _env.check_type(type)
        id = _env.check_id(id)
        if ts.__class__ is not int or not -(1 << 63) <= ts < (1 << 63):
            ts = _ts(ts)
        if len(payload) > PAYLOAD_MAX:
            _env.pack_payload(payload)  # raises, naming the limit
        if nb:  # after the event's own rules, as kl_publish()
            _env.check_not_before(nb, time.time_ns() // 1000000, self._timer_max_ms)
        value = _env.encode(id, type, ts, payload, headers, nb)
        if len(k) + len(value) > RECORD_MAX:
            _env.record_check(k, value, len(payload))
        route = t.route
        part = route.get(k)
        if part is None:
            part = (murmur2(k) & 0x7FFFFFFF) % t.count
            if len(route) >= _ROUTE_CACHE:
                route.clear()
            route[k] = part
        return id, value, part

    def send(
        self,
        topic: str,
        key: _env.Key,
        type: str,
        payload: Any = b"",
        id: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        *,
        ts: Optional[int] = None,
        not_before: Union[int, datetime.datetime, None] = None,
        delay: Union[int, float, datetime.timedelta, None] = None,
    ) -> DeliveryFuture:
        """publish(), returning a future whose result is the event's
        Delivery once Kafka acknowledged it (DeliveryError if it did not).
        The future's ``id`` is the event's idempotency id."""
        box: list = []

        def done(d: Delivery) -> None:
            f = box[0]
            if d.error is None:
                f.set_result(d)
            else:
                f.set_exception(DeliveryError("event %s was not delivered: %s" % (d.id, d.error), [d]))

        event_id = self.publish(
            topic, key, type, payload, id, headers, ts=ts, not_before=not_before, delay=delay, on_delivery=done
        )
        box.append(DeliveryFuture(self, event_id))
        return box[0]

    def _headers(self, headers: Mapping[str, str]) -> Optional[Dict[str, str]]:
        h = _env.check_headers(headers)
        if _current_span is not None and not (h and _env.TRACEPARENT in h):
            span = _current_span().get_span_context()
            if span.is_valid:
                h = _trace_headers(h, span)
        return h

    def _enqueue_wait(self, topic: str, value: bytes, key: bytes, part: int, cb: Any) -> None:
        """librdkafka's queue is full: waits, serving delivery reports, up
        to enqueue_timeout_ms for room."""
        deadline = time.monotonic() + self._enqueue_s
        while True:
            self._rk.poll(0.01)
            try:
                if cb is None:
                    self._produce(topic, value, key, part)
                else:
                    self._produce(topic, value, key, part, on_delivery=cb)
                return
            except BufferError:
                if time.monotonic() >= deadline:
                    raise PublishError(
                        "%d events are waiting for Kafka's acknowledgement, librdkafka's queue is full, and none "
                        "was acknowledged within enqueue_timeout_ms=%d: is the cluster reachable? The event was "
                        "not published" % (len(self._rk), self._enqueue_s * 1000)
                    ) from None

    def poll(self, timeout: float = 0) -> int:
        """Serves delivery reports for up to ``timeout`` seconds; returns
        how many were served."""
        return self._rk.poll(timeout)

    def flush(self, timeout: float = 30.0) -> None:
        """Waits until every event has its delivery report. Raises
        PublishError when some are still in flight after ``timeout``
        seconds, and DeliveryError (its ``failed`` lists them) for events
        Kafka did not take that had no on_delivery callback of their own."""
        left = self._rk.flush(timeout)
        failed, self._failed = self._failed, []
        if left:
            raise PublishError("%d events still wait for Kafka's acknowledgement after %g s" % (left, timeout))
        if failed:
            first = failed[0]
            raise DeliveryError(
                "%d event(s) were not delivered; the first, %s to %s, because: %s"
                % (len(failed), first.id, first.topic, first.error),
                failed,
            )

    def __len__(self) -> int:
        """Events waiting for their delivery report."""
        return len(self._rk)

    def close(self, timeout: float = 10.0) -> None:
        """Stops the watch thread and flushes (see flush())."""
        self._stop.set()
        if self._watch is not None:
            self._watch.join()
            self._watch = None
        self.flush(timeout)

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _trace_headers(headers: Optional[Dict[str, str]], span: Any) -> Dict[str, str]:
    """``headers`` with the W3C trace context of the span context ``span``."""
    h = dict(headers or {})
    h[_env.TRACEPARENT] = "00-%032x-%016x-%02x" % (span.trace_id, span.span_id, span.trace_flags)
    state = span.trace_state.to_header() if span.trace_state else ""
    if state and _env.tracestate_valid(state):
        h[_env.TRACESTATE] = state
    return h


def _ts(ts: Any) -> int:
    v = int(ts)
    if not -(1 << 63) <= v < (1 << 63):
        raise _env.EventError('envelope field "ts" is %d, the limit is %d' % (v, (1 << 63) - 1))
    return v


def _callback(fn: Callable[[Delivery], None], event_id: str) -> Callable[[Optional[KafkaError], Any], None]:
    def cb(err: Optional[KafkaError], msg: Any) -> None:
        fn(_delivery(msg, err, event_id))

    return cb
