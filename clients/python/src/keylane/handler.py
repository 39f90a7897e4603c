"""Write a keylane exec handler as one function.

::

    from keylane.handler import handler, Fail, Retry

    @handler
    def apply(event, tx):
        if event.type != "credit":
            raise Fail("unknown event type %r" % event.type)   # dead letter
        ...  # apply it to your database, fenced by tx.fence
        tx.emit(key="audit", type="credited", payload={"from": event.key})

    if __name__ == "__main__":
        apply.run()

and run it with ``keylane worker ... --handler 'exec:python3 app.py'``.

The function gets the decoded event and a transaction: ``tx.fence`` (also
``event.fence``) is (topic, partition, epoch, offset), which a resource
outside keylane keeps to refuse a deposed owner's writes (docs:
"the fence"); ``tx.emit()`` adds a follow-up event, published through
keylane's outbox after the event is committed, and only if it is;
``tx.cancel(id)`` cancels a pending timer (a delayed event) of the event's
own key, in the same commit.

Its outcome is the answer: returning (None) is "ok"; raising Retry is
"retry" (the event runs again, counting against worker.max.attempts);
raising Fail is "fail" (the event goes to the dead-letter topic); any other
exception is "retry" with its text, and its traceback goes to stderr, which
keylane copies into its log. Emits and cancels are sent with "ok" only.

The JSON-lines protocol is handled here: the "seq" echo, pipelining (the
worker may send up to worker.exec.window events before the first answer:
they are read in one go and answered in one write), and stdout, which
belongs to the protocol: print() in a handler goes to stderr instead.

Standard library only, so a handler needs neither confluent-kafka nor
msgpack. Thread safety: the handler function is called on one thread, one
event at a time, in the order the worker sent them (one key's events
always in order).
"""
from __future__ import annotations

import base64
import datetime
import json
import os
import re
import sys
import traceback
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Union

from keylane._when import not_before_ms
from keylane.errors import EventError

__all__ = ["Event", "Fail", "Fence", "Handler", "Retry", "Tx", "handler"]

KEY_MAX = 1024
TYPE_MAX = 255
TOPIC_MAX = 249
#: An event id's longest, in bytes (KL_ID_MAX): no timer has a longer one.
ID_MAX = 255
#: The most timers one answer cancels (the worker's KL__EXEC_CANCEL_MAX).
CANCEL_MAX = 64
_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]+\Z")
_SEQ = re.compile(rb'\s*\{\s*"seq"\s*:\s*([0-9]{1,19})\s*[,}]')
#: No payload given to Tx.emit(): the follow-up's payload is empty.
_NONE: Any = object()
_INF = float("inf")
#: How much of a malformed request an answer quotes.
_QUOTE_MAX = 200


class Retry(Exception):
    """Raise to answer "retry": the worker runs the event again later (a
    resource that is down, a fenced write); it counts against
    worker.max.attempts, after which the event is dead-lettered."""


class Fail(Exception):
    """Raise to answer "fail": the event is sent to the dead-letter topic
    with this exception's text as the reason (a malformed event, a rule it
    breaks). Retrying would not help."""


class Fence(NamedTuple):
    """Where the event is and who owns it: a resource outside keylane keeps
    the newest epoch per (topic, partition), refuses writes with an older
    one, and applies each event id once."""

    topic: str
    partition: int
    epoch: int
    offset: int


class Event:
    """One event as the worker sent it.

    ``key`` is the entity key (str; bytes when it is not UTF-8);
    ``payload`` the payload as JSON gives it (what a publisher packed from
    a dict is a dict again; a msgpack bin inside it is {"$base64": ...}),
    or bytes when the payload is not msgpack JSON can say (raw bytes, an
    empty payload: b""). ``traceparent`` / ``tracestate`` carry the W3C
    trace context, None when the event has none. ``not_before`` is a
    delayed event's time (ms since the Unix epoch; it runs once that time
    came), 0 for one applied when read. ``request`` is the JSON
    line as a dict, for fields a newer keylane adds."""

    __slots__ = ("key", "id", "type", "ts", "payload", "fence", "traceparent", "tracestate", "not_before", "request")

    def __init__(self, request: Dict[str, Any]):
        self.request = request
        key = request.get("key")
        self.key: Union[str, bytes] = key if key is not None else base64.b64decode(request["key_b64"])
        self.id: str = request["id"]
        self.type: str = request["type"]
        self.ts: int = request.get("ts", 0)
        if "payload" in request:
            self.payload: Any = request["payload"]
        else:
            self.payload = base64.b64decode(request.get("payload_b64", ""))
        self.fence = Fence(request["topic"], request["partition"], request["epoch"], request["offset"])
        self.traceparent: Optional[str] = request.get("traceparent")
        self.tracestate: Optional[str] = request.get("tracestate")
        self.not_before: int = request.get("not_before", 0)

    @property
    def topic(self) -> str:
        return self.fence.topic

    @property
    def partition(self) -> int:
        return self.fence.partition

    @property
    def offset(self) -> int:
        return self.fence.offset

    @property
    def epoch(self) -> int:
        return self.fence.epoch

    @property
    def key_bytes(self) -> bytes:
        """The key's bytes, whether it is text or not."""
        return self.key.encode("utf-8") if isinstance(self.key, str) else self.key

    def __repr__(self) -> str:
        return "Event(key=%r, id=%r, type=%r, fence=%r)" % (self.key, self.id, self.type, self.fence)


class Tx:
    """The event's transaction: its fence, the follow-ups it emits and the
    timers it cancels. Emits are committed with the event (keylane's
    outbox) and published after that commit, only when the handler
    answered "ok"; keylane derives each one's id from the event's place in
    the log, so a retried event never emits twice. Cancels commit with the
    event too, and only with "ok"."""

    __slots__ = ("fence", "emits", "cancels", "key")

    def __init__(self, fence: Fence, key: Union[str, bytes, None] = None):
        self.fence = fence
        #: the event's key, which cancel() checks a given key against
        self.key = key
        self.emits: List[Dict[str, Any]] = []
        self.cancels: List[Dict[str, Any]] = []

    def cancel(self, id: str, *, key: Union[str, bytes, None] = None) -> None:
        """Cancels the pending timer of the delayed event ``id`` (the id its
        publisher gave it) of the event's own key: it never fires. The
        cancel commits with the event (``kl_txn_cancel()``); a timer that
        no longer waits (it ran, before this event in the key's order, or
        was cancelled, or never was) is no error. ``key``, when given,
        must be the event's: a handler cancels its own key's timers only;
        to cancel another key's, emit a follow-up to that key whose
        handler cancels it. At most 64 per event. Raises Fail, and so
        fails the event, for a cancel keylane would refuse: nothing of the
        event's is then cancelled."""
        if not isinstance(id, str):
            raise Fail('cancel: "id" must be the delayed event\'s id, a string, not %r' % (id,))
        n = len(id.encode("utf-8"))
        if not 0 < n <= ID_MAX:
            raise Fail('cancel: "id" is %d bytes; an event\'s id is 1 to %d bytes, so no timer has it' % (n, ID_MAX))
        if "\x00" in id:
            raise Fail('cancel: "id" holds a NUL byte; an event\'s id is text without NUL, so no timer has it')
        if key is not None and self.key is not None and key != self.key:
            raise Fail(
                "cancel: key %r is not the event's (%r): a handler cancels its own key's timers; "
                "to cancel another key's, emit a follow-up to that key whose handler cancels it" % (key, self.key)
            )
        if len(self.cancels) >= CANCEL_MAX:
            raise Fail("cancel: more than %d timers in one event; cancel the rest from a follow-up to the key" % CANCEL_MAX)
        self.cancels.append({"id": id})

    def emit(
        self,
        key: str,
        type: str,
        payload: Any = _NONE,
        *,
        topic: Optional[str] = None,
        not_before: Union[int, datetime.datetime, None] = None,
        delay: Union[int, float, datetime.timedelta, None] = None,
    ) -> None:
        """Adds a follow-up event of ``key`` and ``type`` to ``topic`` (the
        event's own when None). ``payload`` is any JSON value (keylane
        stores its msgpack, as a publisher's dict) or bytes (stored as they
        are); left out, the payload is empty. ``not_before`` (ms since the
        Unix epoch, or an aware datetime) or ``delay`` (seconds, or a
        timedelta, from now), not both, delay it as a publisher's do: its
        worker applies it once that time came (at most timer.max.delay
        ahead). Raises Fail, and so fails the event, for a follow-up
        keylane would refuse: no partial emits."""
        item: Dict[str, Any] = {"key": _emit_text("key", key, KEY_MAX), "type": _emit_text("type", type, TYPE_MAX)}
        if topic is not None:
            item["topic"] = _emit_topic(topic)
        try:
            nb = not_before_ms(not_before, delay)
        except EventError as e:
            raise Fail("emit: %s" % e) from None
        if nb:
            item["not_before"] = nb
        if isinstance(payload, (bytes, bytearray, memoryview)):
            item["payload_b64"] = base64.b64encode(bytes(payload)).decode("ascii")
        elif payload is not _NONE:
            where = _non_finite(payload, "payload")
            if where is not None:
                raise Fail(
                    "emit: %s is %r, which JSON cannot carry (no NaN or Infinity): "
                    "pass a finite number, a string or None" % where
                )
            try:
                json.dumps(payload, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise Fail('emit: the payload is not a JSON value (%s): pass bytes or JSON-able data' % e) from None
            item["payload"] = payload
        self.emits.append(item)


def _emit_text(field: str, value: Any, limit: int) -> str:
    if not isinstance(value, str) or not value:
        raise Fail('emit: "%s" must be a non-empty string, not %r' % (field, value))
    if "\0" in value:
        raise Fail('emit: "%s" holds a NUL: it must be text without NUL' % field)
    n = len(value.encode("utf-8"))
    if n > limit:
        raise Fail('emit: "%s" is %d bytes, the limit is %d' % (field, n, limit))
    return value


def _non_finite(value: Any, path: str) -> Optional[tuple]:
    """(path, value) of the first NaN or infinity in a JSON-able value,
    with the path as a reader names it (payload["a"][0]), or None."""
    if isinstance(value, float):
        return None if value == value and value not in (_INF, -_INF) else (path, value)
    if isinstance(value, dict):
        items = ((path + "[%r]" % k, v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((path + "[%d]" % i, v) for i, v in enumerate(value))
    else:
        return None
    for sub, v in items:
        found = _non_finite(v, sub)
        if found is not None:
            return found
    return None


def _emit_topic(topic: Any) -> str:
    if not isinstance(topic, str) or not 0 < len(topic) <= TOPIC_MAX or topic in (".", ".."):
        raise Fail("emit: topic %r is not a Kafka topic name (1..%d of letters, digits, '.', '_', '-')" % (topic, TOPIC_MAX))
    if not _TOPIC_CHARS.match(topic):
        raise Fail("emit: topic %r has a character Kafka does not allow: letters, digits, '.', '_' and '-'" % topic)
    if topic.startswith("__"):
        raise Fail("emit: topic %r is internal to Kafka (__*): a handler may not emit to it" % topic)
    if topic.endswith(".dlq"):
        raise Fail("emit: topic %r is a dead-letter topic (*.dlq): a handler may not emit to it" % topic)
    return topic


class _Tracer:
    """A CONSUMER span per event that carries a trace context, when
    opentelemetry-api is installed (README "Trace context")."""

    def __init__(self, name: str):
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._tracer = trace.get_tracer(name)
        self._propagator = TraceContextTextMapPropagator()

    def span(self, event: Event):
        carrier = {"traceparent": event.traceparent}
        if event.tracestate:
            carrier["tracestate"] = event.tracestate
        ctx = self._propagator.extract(carrier)
        return self._tracer.start_as_current_span(
            "process " + event.topic,
            context=ctx,
            kind=self._trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.destination.name": event.topic,
                "messaging.destination.partition.id": str(event.partition),
                "messaging.kafka.offset": event.offset,
                "messaging.message.id": event.id,
            },
        )


class Handler:
    """An exec handler made of one function ``fn(event, tx)``; see the
    module's doc. Calling it calls the function."""

    def __init__(self, fn: Callable[[Event, Tx], Any]):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "handler")
        self.__doc__ = getattr(fn, "__doc__", None)
        self._tracer: Optional[_Tracer] = None
        self._tracing = None  # unknown until the first traced event

    def __call__(self, event: Event, tx: Tx) -> Any:
        return self.fn(event, tx)

    # ---- one event ----

    def answer(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Runs the function on one request (a JSON line as a dict) and
        returns the answer as a dict: {"seq"?, "status", "error"?,
        "emit"?, "cancel"?}. For tests of a handler without a worker."""
        seq = request.get("seq")
        try:
            event = Event(request)
        except KeyError as e:
            return _answer(seq, "fail", "keylane.handler: a request without its %s: %s" % (_missing(e), _quote(request)))
        except (TypeError, ValueError) as e:
            return _answer(seq, "fail", "keylane.handler: a request with a malformed field (%s): %s" % (e, _quote(request)))
        tx = Tx(event.fence, event.key)
        try:
            if event.traceparent and self._traced():
                with self._tracer.span(event):  # type: ignore[union-attr]
                    result = self.fn(event, tx)
            else:
                result = self.fn(event, tx)
        except Fail as e:
            return _answer(seq, "fail", str(e) or type(e).__name__)
        except Retry as e:
            return _answer(seq, "retry", str(e) or type(e).__name__)
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            return _answer(seq, "retry", "%s: %s" % (type(e).__name__, e))
        if result is not None:
            return _answer(
                seq,
                "retry",
                "%s returned %r: return None (ok), or raise Retry or Fail" % (self.__name__, result),
            )
        answer = {"seq": seq, "status": "ok"} if seq is not None else {"status": "ok"}
        if tx.emits:
            answer["emit"] = tx.emits
        if tx.cancels:
            answer["cancel"] = tx.cancels
        return answer

    def _traced(self) -> bool:
        if self._tracing is None:
            try:
                self._tracer = _Tracer(self.__name__)
                self._tracing = True
            except ImportError:
                self._tracing = False
        return bool(self._tracing)

    def _line(self, line: bytes) -> bytes:
        """The answer line to one request line."""
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            # keylane wrote it: a broken line means a broken pipe. Answer
            # it when its seq can be read, or stop (keylane restarts us).
            m = _SEQ.match(line)
            print("keylane.handler: a request line that is not JSON (%s): %r" % (e, line[:200]), file=sys.stderr)
            if not m:
                raise SystemExit(1)
            request = {"seq": int(m.group(1))}
        answer = self.answer(request)
        if len(answer) == 2 and answer.get("status") == "ok" and "seq" in answer:
            return b'{"seq":%d,"status":"ok"}\n' % answer["seq"]
        return (json.dumps(answer, separators=(",", ":")) + "\n").encode("utf-8")

    # ---- the loop ----

    def run(self, stdin: Optional[int] = None, stdout: Optional[int] = None) -> None:
        """Serves the worker: reads request lines from ``stdin`` (a file
        descriptor, default 0) until it closes and writes each answer to
        ``stdout`` (default 1). Every line that arrived together is
        answered in one write. Meanwhile sys.stdout is stderr, and (with
        the default stdout) so is file descriptor 1, so that neither a
        print() nor a child process's output can break the protocol."""
        fd_in = 0 if stdin is None else stdin
        if stdout is None:
            sys.stdout.flush()
            fd_out = os.dup(1)
            os.dup2(2, 1)
        else:
            fd_out = stdout
        saved = sys.stdout
        sys.stdout = sys.stderr
        try:
            self._serve(fd_in, fd_out)
        finally:
            sys.stdout = saved
            if stdout is None:
                os.dup2(fd_out, 1)
                os.close(fd_out)

    def _serve(self, fd_in: int, fd_out: int) -> None:
        pending = b""
        line = self._line
        # One buffer for every read: os.read(fd, n) allocates n bytes each
        # call, and a large n is an mmap and a munmap per event when the
        # worker sends them one or two at a time.
        buf = bytearray(1 << 16)
        while True:
            n = os.readv(fd_in, [buf])
            if not n:
                return
            chunk = bytes(buf[:n])
            pending += chunk
            if b"\n" not in chunk:
                continue
            lines = pending.split(b"\n")
            pending = lines.pop()
            for raw in lines:
                if raw.strip():
                    view = memoryview(line(raw))
                    while view:
                        n = os.write(fd_out, view)
                        view = view[n:]


def _missing(e: KeyError) -> str:
    """The field a KeyError from Event() names, as the protocol names it:
    the key comes as "key" (text) or "key_b64" (bytes)."""
    field = e.args[0] if e.args else "?"
    if field == "key_b64":
        return '"key" (or "key_b64") field'
    return '"%s" field' % field


def _quote(request: Dict[str, Any]) -> str:
    """The request's repr cut to _QUOTE_MAX characters: an answer to a
    huge malformed request stays small."""
    text = repr(request)
    if len(text) <= _QUOTE_MAX:
        return text
    return "%s... (%d characters)" % (text[:_QUOTE_MAX], len(text))


def _answer(seq: Optional[int], status: str, error: str) -> Dict[str, Any]:
    answer: Dict[str, Any] = {"seq": seq} if seq is not None else {}
    answer["status"] = status
    answer["error"] = error
    return answer


def handler(fn: Callable[[Event, Tx], Any]) -> Handler:
    """Makes ``fn(event, tx)`` an exec handler: ``@handler def apply(...)``,
    then ``apply.run()`` in the program keylane starts."""
    return Handler(fn)

