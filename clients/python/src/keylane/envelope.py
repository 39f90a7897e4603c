"""The event envelope: its limits, its msgpack encoding and a strict decoder.

On Kafka an event is a message whose key is the entity key and whose value
is a msgpack map, the envelope (keylane's include/keylane/event.h):

=====  ===============  ==============================
field  type             limit
=====  ===============  ==============================
v      positive int     1, or 2 with nb
id     str              1..ID_MAX bytes
t      str              1..TYPE_MAX bytes
ts     int              producer time, ms since epoch
p      bin              0..PAYLOAD_MAX bytes
h      map str => str   optional, <= HEADERS_MAX
nb     positive int     optional (version 2): not before,
                        ms since epoch
=====  ===============  ==============================

The fields are written in that order, each in the smallest msgpack form
that holds it: the bytes kl_event_encode() writes for the same event
(tests/clients compares them). An event without a not_before is version 1,
which every keylane reads; a delayed one is version 2, so that a worker too
old for timers refuses it rather than apply it early. The message key is
1..KEY_MAX bytes.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
import threading
import time
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple, Union

import msgpack

from keylane._when import _INT64_MAX, TIMER_MAX_DELAY_MS, check_not_before, not_before_ms, now_ms  # noqa: F401
from keylane.errors import EventError

#: The highest envelope version this package reads; it writes version 1
#: unless the event has a not_before (version 2, with "nb").
ENVELOPE_VERSION = 2
KEY_MAX = 1024
ID_MAX = 255
#: The first character of the ids keylane derives for follow-up events
#: ("~<topic>/<partition>/<offset>/<index>/<nonce>"): an id a client
#: publishes may not begin with it.
ID_RESERVED = "~"
TYPE_MAX = 255
#: Types beginning with it are kept for keylane's own records: a client
#: may publish none.
TYPE_RESERVED = "~"
#: Kafka's default message.max.bytes.
MESSAGE_MAX = 1048588
#: The largest key + envelope of one record: MESSAGE_MAX less the framing.
RECORD_MAX = MESSAGE_MAX - 128
PAYLOAD_MAX = 1022 * 1024
HEADERS_MAX = 64
HEADER_NAME_MAX = 255
HEADER_VALUE_MAX = 4096
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACESTATE_MAX = 512
#: The largest envelope a decoder accepts: all fields at their limits.
ENVELOPE_MAX = PAYLOAD_MAX + HEADERS_MAX * (HEADER_NAME_MAX + HEADER_VALUE_MAX + 10) + 1024

Bytes = Union[bytes, bytearray, memoryview]
Key = Union[str, Bytes]


class Event(NamedTuple):
    """A decoded event. ``payload`` is the raw bytes of the envelope's "p"
    (use :func:`unpack_payload` for the value a JSON or msgpack publisher
    gave)."""

    key: bytes
    id: str
    type: str
    ts: int
    payload: bytes
    headers: Dict[str, str]
    #: ms since the Unix epoch before which the event is not applied; 0: none
    not_before: int = 0


# ---- limits, shared by the encoder and the decoder ----


def _printable(s: str) -> str:
    """At most 64 characters of ``s``, control and non-ASCII ones and '"'
    shown as '?', so that a hostile value cannot garble a message."""
    shown = "".join(c if " " <= c < "\x7f" and c != '"' else "?" for c in s[:64])
    return shown + ("..." if len(s) > 64 else "")


def key_bytes(key: Key) -> bytes:
    """``key`` as the message key: a str is UTF-8; 1..KEY_MAX bytes."""
    if isinstance(key, str):
        b = key.encode("utf-8", "surrogatepass")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        b = bytes(key)
    else:
        raise EventError("the key is a %s: give the entity key as str or bytes" % type(key).__name__)
    if not b:
        raise EventError("message has no key; the entity key is required, 1..%d bytes" % KEY_MAX)
    if len(b) > KEY_MAX:
        raise EventError("message key is %d bytes, the limit is %d" % (len(b), KEY_MAX))
    return b


def _len_check(field: str, n: int, low: int, high: int) -> None:
    if n < low:
        raise EventError('envelope field "%s" is empty' % field)
    if n > high:
        raise EventError('envelope field "%s" is %d bytes, the limit is %d' % (field, n, high))


def _text(field: str, value: Any, what: str) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise EventError('envelope field "%s" is not valid UTF-8 at byte %d: %s is text' % (field, e.start, what)) from None
    if not isinstance(value, str):
        raise EventError('envelope field "%s" is a %s: %s is a str' % (field, type(value).__name__, what))
    return value


def _utf8(field: str, s: str) -> bytes:
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise EventError('envelope field "%s" is not valid UTF-8 at character %d (a lone surrogate)' % (field, e.start)) from None


def check_id(event_id: Any, client: bool = True) -> str:
    """Checks an idempotency id: UTF-8 text without NUL, 1..ID_MAX bytes,
    and (``client``) not beginning with ID_RESERVED. Returns it as str."""
    s = _text("id", event_id, "an id")
    n = len(s) if s.isascii() else len(_utf8("id", s))
    _len_check("id", n, 1, ID_MAX)
    nul = s.find("\0")
    if nul >= 0:
        raise EventError(
            'envelope field "id" holds a NUL at byte %d: an id is UTF-8 text without NUL, as JSON carries it'
            % len(s[:nul].encode("utf-8"))
        )
    if client:
        _reserved_check(s)
    return s


def _reserved_check(event_id: str) -> None:
    if event_id[:1] == ID_RESERVED:
        raise EventError(
            "id \"%s\" begins with '%s', which keylane keeps for the ids it derives for follow-up "
            "events: choose an id that does not (or omit it to have one made)" % (_printable(event_id), ID_RESERVED)
        )


def check_type(event_type: Any, client: bool = True) -> str:
    """Checks an event type: text, 1..TYPE_MAX bytes, and (``client``) not
    beginning with TYPE_RESERVED. Returns it as str."""
    s = _text("t", event_type, "a type")
    _len_check("t", len(s) if s.isascii() else len(_utf8("t", s)), 1, TYPE_MAX)
    if client:
        _reserved_type_check(s)
    return s


def _reserved_type_check(event_type: str) -> None:
    if event_type[:1] == TYPE_RESERVED:
        raise EventError(
            "type \"%s\" begins with '%s', which keylane keeps for its own records: "
            "choose a type that does not" % (_printable(event_type), TYPE_RESERVED)
        )


_HEX = re.compile(r"[0-9a-f]*\Z")


def traceparent_valid(value: str) -> bool:
    """True when ``value`` is a W3C traceparent keylane carries:
    "VV-<32 hex>-<16 hex>-<2 hex>", lower-case hex, neither id all zeros,
    version not ff, version 00 exactly 55 characters."""
    v = value
    if len(v) < 55 or len(v) > HEADER_VALUE_MAX or v[2] != "-" or v[35] != "-" or v[52] != "-":
        return False
    parts = (v[0:2], v[3:35], v[36:52], v[53:55])
    if not all(len(p) and _HEX.match(p) for p in parts) or parts[0] == "ff":
        return False
    if parts[1] == "0" * 32 or parts[2] == "0" * 16:
        return False
    if parts[0] == "00":
        return len(v) == 55
    return len(v) == 55 or v[55] == "-"


def tracestate_valid(value: str) -> bool:
    """True when ``value`` is at most TRACESTATE_MAX printable ASCII chars."""
    return len(value) <= TRACESTATE_MAX and all(" " <= c <= "~" for c in value)


def check_headers(headers: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    """Checks headers (a mapping of str to str): at most HEADERS_MAX, names
    1..HEADER_NAME_MAX bytes, values at most HEADER_VALUE_MAX bytes, and a
    traceparent / tracestate must be valid. Returns them as a dict, or
    None when there are none."""
    if not headers:
        return None
    if not isinstance(headers, Mapping):
        raise EventError('envelope field "h" is a %s: headers are a mapping of str to str' % type(headers).__name__)
    if len(headers) > HEADERS_MAX:
        raise EventError('envelope field "h" has %d headers, the limit is %d' % (len(headers), HEADERS_MAX))
    out = {}
    for i, (name, value) in enumerate(headers.items()):
        name = _text("h", name, "a header name")
        value = _text("h", value, "a header value")
        n = len(_utf8("h", name))
        if n == 0:
            raise EventError("header %d has an empty name" % i)
        if n > HEADER_NAME_MAX:
            raise EventError("header %d's name is %d bytes, the limit is %d" % (i, n, HEADER_NAME_MAX))
        n = len(_utf8("h", value))
        if n > HEADER_VALUE_MAX:
            raise EventError('header "%s" value is %d bytes, the limit is %d' % (_printable(name), n, HEADER_VALUE_MAX))
        if name in out:
            raise EventError('header "%s" appears twice' % _printable(name))
        out[name] = value
    tp = out.get(TRACEPARENT)
    if tp is not None and not traceparent_valid(tp):
        raise EventError(
            'header traceparent "%s" is not a W3C traceparent: send "00-<32 lower-case hex trace id>-'
            '<16 hex parent id>-<2 hex flags>" (ids not all zeros) or leave it out' % tp[:80]
        )
    ts = out.get(TRACESTATE)
    if ts is not None and not tracestate_valid(ts):
        raise EventError(
            "header tracestate is %d bytes or holds a character outside printable ASCII: W3C allows at "
            "most %d printable characters; shorten it or leave it out" % (len(_utf8("h", ts)), TRACESTATE_MAX)
        )
    return out


def pack_payload(payload: Any) -> bytes:
    """The payload's bytes: bytes-like as they are; any other value as its
    msgpack, the mapping `keylane publish` uses for a JSON payload (a dict
    is a map in its order, int the smallest int form, float a float64, str
    a str, list and tuple an array, None nil). Raises EventError over
    PAYLOAD_MAX bytes or for a value msgpack cannot pack."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        p = bytes(payload)
    else:
        try:
            p = _packb(payload)
        except (TypeError, ValueError, OverflowError) as e:
            raise EventError(
                "the payload cannot be packed as msgpack (%s): pass bytes, or a value made of dict, list, "
                "tuple, str, bytes, int, float, bool and None" % e
            ) from None
    if len(p) > PAYLOAD_MAX:
        raise EventError('envelope field "p" is %d bytes, the limit is %d' % (len(p), PAYLOAD_MAX))
    return p


def unpack_payload(payload: bytes) -> Any:
    """The value of a payload a JSON or msgpack publisher gave."""
    return msgpack.unpackb(payload, raw=False)


_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def record_check(key: bytes, envelope: bytes, payload_len: int) -> None:
    """Raises EventError when key + envelope exceed RECORD_MAX."""
    size = len(key) + len(envelope)
    if size > RECORD_MAX:
        raise EventError(
            "event is %d bytes as a Kafka record (key %d + envelope %d), over the %d one record may carry "
            "(Kafka's default message.max.bytes, %d, less the batch framing): make the payload (%d bytes) or "
            "the headers smaller" % (size, len(key), len(envelope), RECORD_MAX, MESSAGE_MAX, payload_len)
        )


def encode(
    event_id: str,
    event_type: str,
    ts: int,
    payload: bytes,
    headers: Optional[Dict[str, str]] = None,
    not_before: int = 0,
) -> bytes:
    """The envelope of an event whose fields were checked (check_id,
    check_type, pack_payload, check_headers, not_before_ms). An id or type
    beginning with ID_RESERVED or TYPE_RESERVED is refused here too: a
    worker dead-letters such a record (reason reserved_id) unless keylane
    wrote it. A not_before (> 0) makes it version 2, with "nb" last, as
    kl_event_encode() writes it."""
    _reserved_check(event_id)
    _reserved_type_check(event_type)
    env: Dict[str, Any] = {"v": 2 if not_before else 1, "id": event_id, "t": event_type, "ts": ts, "p": payload}
    if headers:
        env["h"] = headers
    if not_before:
        env["nb"] = not_before
    return _packb(env)


# ---- ids ----


class _Ids:
    """UUIDv7 ids (RFC 9562), as keylane's kl_event_make_id(): 48-bit Unix
    ms, version 7, a 12-bit counter seeded with 11 random bits (so ids made
    in one process only grow, also across threads and a clock that steps
    back: past 2048+ ids in a ms it borrows the next ms, as the RFC
    allows), variant 10, 62 random bits.

    Randomness comes from one os.urandom() call per 400 ids, and the text
    is put together from pieces made once (the ms's part once per ms, the
    counter's from a table): formatting a 128-bit int per id cost more than
    the rest of Publisher.publish()."""

    _BATCH = 400
    #: "7" (the version) and the counter's 3 hex digits, by counter
    _COUNTER = ["7%03x-" % c for c in range(4096)]
    #: byte -> the variant's hex digit (10xx: 8, 9, a, b)
    _VARIANT = bytes(ord("89ab"[b & 3]) for b in range(256))

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0
        self._i = self._BATCH
        self._seeds = b""
        self._variants = ""
        self._hex = ""
        self._ms = -1
        self._prefix = ""

    def forget(self) -> None:
        """Drops the random pool (in a child after fork())."""
        self._i = self._BATCH

    def _refill(self) -> None:
        raw = os.urandom(11 * self._BATCH)
        b = self._BATCH
        self._seeds = raw[: 2 * b]  # 11 bits of the counter's seed
        self._variants = raw[2 * b : 3 * b].translate(self._VARIANT).decode("ascii")
        self._hex = raw[3 * b :].hex()  # 15 of 16 hex digits per id used
        self._i = 0

    def make(self, now_ms: Optional[int] = None) -> str:
        if now_ms is None:
            now_ms = time.time_ns() // 1000000
        with self._lock:
            i = self._i
            if i >= self._BATCH:
                self._refill()
                i = 0
            self._i = i + 1
            seeds = self._seeds
            stamp = (now_ms << 12) | ((seeds[2 * i] & 0x07) << 8) | seeds[2 * i + 1]
            if stamp <= self._last:
                stamp = self._last + 1
            self._last = stamp
            ms = stamp >> 12
            if ms != self._ms:
                self._ms = ms
                self._prefix = "%08x-%04x-" % (ms >> 16, ms & 0xFFFF)
            prefix = self._prefix
            variant = self._variants[i]
            hx = self._hex
        a = 16 * i
        return "%s%s%s%s-%s" % (prefix, self._COUNTER[stamp & 0xFFF], variant, hx[a : a + 3], hx[a + 3 : a + 15])


_ids = _Ids()
os.register_at_fork(after_in_child=_ids.forget)

try:  # the same ids, made in C (keylane/_speedups.c), when it was built
    from keylane._speedups import forget_ids as _forget_ids
    from keylane._speedups import make_id as _make_id_c
except ImportError:  # pragma: no cover - depends on the build
    _make_id_c = None
else:

    class _CIds:
        """_Ids' interface on the C maker; the GIL guards its state."""

        @staticmethod
        def make(now_ms: Optional[int] = None) -> str:
            return _make_id_c(time.time_ns() // 1000000 if now_ms is None else now_ms)

    _ids = _CIds()  # type: ignore[assignment]
    # A child after fork() must not reuse the parent's random bytes: its
    # ids in the same ms would be the parent's.
    os.register_at_fork(after_in_child=_forget_ids)


def make_id() -> str:
    """A new time-ordered idempotency id (UUIDv7 text, 36 characters)."""
    return _ids.make()


# ---- decoding ----

_FIELDS = ("v", "id", "t", "ts", "p", "h", "nb")


class _Map(list):
    """A msgpack map as its (key, value) pairs, so repeats can be seen."""


def decode(key: Key, value: Bytes) -> Event:
    """Decodes a Kafka message into an Event, checking every field as
    keylane's worker does (unknown or repeated fields, types, limits).
    Raises EventError naming the first problem."""
    k = bytes(key) if not isinstance(key, str) else key.encode("utf-8")
    if not k:
        raise EventError("message has no key; the entity key is required, 1..%d bytes" % KEY_MAX)
    if len(k) > KEY_MAX:
        raise EventError("message key is %d bytes, the limit is %d" % (len(k), KEY_MAX))
    if len(value) == 0:
        raise EventError("message value is empty: no envelope (a tombstone?)")
    if len(value) > ENVELOPE_MAX:
        raise EventError("envelope is %d bytes, the limit is %d" % (len(value), ENVELOPE_MAX))
    try:
        env = msgpack.unpackb(bytes(value), raw=False, object_pairs_hook=_Map, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise EventError("envelope is not one msgpack value: %s" % e) from None
    if not isinstance(env, _Map):
        raise EventError("envelope is a msgpack %s, it must be a map" % type(env).__name__)
    fields: Dict[str, Any] = {}
    for name, v in env:
        if not isinstance(name, str):
            raise EventError("envelope field names must be str, found a msgpack %s" % type(name).__name__)
        if name not in _FIELDS:
            raise EventError(
                'envelope has a field "%s" that version %d does not define (v, id, t, ts, p, h, nb)'
                % (_printable(name), ENVELOPE_VERSION)
            )
        if name in fields:
            raise EventError('envelope field "%s" appears twice' % name)
        fields[name] = v
        if name == "v" and (type(v) is not int or not 1 <= v <= ENVELOPE_VERSION):
            raise EventError('envelope version "v" is %r, this build reads versions 1 to %d' % (v, ENVELOPE_VERSION))
    for name in _FIELDS[:5]:
        if name not in fields:
            raise EventError('envelope lacks the required field "%s"' % name)
    nb = fields.get("nb", 0)
    if "nb" in fields:
        if type(nb) is not int or nb <= 0:
            raise EventError(
                'envelope field "nb" is a msgpack %s, it must be a positive int (ms since the epoch)'
                % ("non-positive int" if type(nb) is int else type(nb).__name__)
            )
        if nb > _INT64_MAX:
            raise EventError('envelope field "nb" is %d, the limit is %d' % (nb, _INT64_MAX))
        # A version 1 producer cannot mean "not before": the field is not its.
        if fields["v"] < 2:
            raise EventError(
                'envelope has the field "nb" (not before) but version %d, which lacks it: a delayed event is '
                "version 2" % fields["v"]
            )
    if not isinstance(fields["id"], str):
        raise EventError('envelope field "id" is a msgpack %s, it must be a str' % type(fields["id"]).__name__)
    event_id = check_id(fields["id"], client=False)
    if not isinstance(fields["t"], str):
        raise EventError('envelope field "t" is a msgpack %s, it must be a str' % type(fields["t"]).__name__)
    event_type = check_type(fields["t"], client=False)
    ts = fields["ts"]
    if type(ts) is not int:
        raise EventError('envelope field "ts" is a msgpack %s, it must be an int (ms since the epoch)' % type(ts).__name__)
    p = fields["p"]
    if not isinstance(p, bytes):
        raise EventError('envelope field "p" is a msgpack %s, it must be a bin' % type(p).__name__)
    _len_check("p", len(p), 0, PAYLOAD_MAX)
    headers: Dict[str, str] = {}
    h = fields.get("h")
    if h is not None:
        if not isinstance(h, _Map):
            raise EventError('envelope field "h" is a msgpack %s, it must be a map of str to str' % type(h).__name__)
        if len(h) > HEADERS_MAX:
            raise EventError('envelope field "h" has %d headers, the limit is %d' % (len(h), HEADERS_MAX))
        for name, v in h:
            if not isinstance(name, str) or not isinstance(v, str):
                raise EventError('envelope field "h" holds a header that is not str to str')
            if name in headers:
                raise EventError('header "%s" appears twice' % _printable(name))
            headers[name] = v
        # The decoder does not check the trace context (a worker passes on
        # what another producer wrote); only the limits.
        for i, (name, v) in enumerate(headers.items()):
            if not name:
                raise EventError("header %d has an empty name" % i)
            if len(name.encode("utf-8")) > HEADER_NAME_MAX:
                raise EventError("header %d's name is %d bytes, the limit is %d" % (i, len(name.encode()), HEADER_NAME_MAX))
            if len(v.encode("utf-8")) > HEADER_VALUE_MAX:
                raise EventError('header "%s" value is %d bytes, the limit is %d' % (_printable(name), len(v.encode()), HEADER_VALUE_MAX))
    return Event(k, event_id, event_type, ts, p, headers, nb)


def encode_event(
    key: Key,
    event_type: str,
    payload: Any = b"",
    event_id: Optional[str] = None,
    headers: Optional[Mapping[str, str]] = None,
    ts: Optional[int] = None,
    not_before: Union[int, _dt.datetime, None] = None,
    delay: Union[int, float, _dt.timedelta, None] = None,
) -> Tuple[bytes, bytes, str]:
    """Checks an event as kl_publish() does and encodes it: returns
    (message key, envelope, id). ``event_id`` None makes one, ``ts`` None
    stamps the current time; ``not_before`` or ``delay`` (not_before_ms())
    delay it."""
    k = key_bytes(key)
    t = check_type(event_type)
    i = make_id() if event_id is None else check_id(event_id)
    p = pack_payload(payload)
    h = check_headers(headers)
    nb = not_before_ms(not_before, delay)
    value = encode(i, t, now_ms() if ts is None else int(ts), p, h, nb)
    record_check(k, value, len(p))
    return k, value, i
