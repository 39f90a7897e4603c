"""The envelope: the bytes keylane's kl_event_encode() writes, the limits
and error texts of kl_event_validate() and kl_publish(), the strict
decoder, and UUIDv7 ids."""
import datetime
import threading
import uuid

import msgpack
import pytest

from keylane import envelope as env
from keylane.errors import EventError


def test_encoding_is_the_c_encoders_bytes():
    # Written out by hand from event/envelope.c: fixmap 5, "v" 1, "id"
    # fixstr, "t" fixstr, "ts" uint64, "p" bin8.
    _, value, _ = env.encode_event("acct-1", "credit", {"amount": 5}, "id-1", ts=1700000000000)
    want = (
        b"\x85\xa1v\x01\xa2id\xa4id-1\xa1t\xa6credit\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5\x68\x00"
        b"\xa1p\xc4\x09\x81\xa6amount\x05"
    )
    assert value == want


@pytest.mark.parametrize(
    "n,head",
    [(31, b"\xbf"), (32, b"\xd9\x20"), (255, b"\xd9\xff")],
)
def test_str_forms_at_their_boundaries(n, head):
    _, value, _ = env.encode_event("k", "t" * n, b"", "i", ts=0)
    assert b"\xa1t" + head + b"t" * n + b"\xa2ts" in value
    assert env.decode(b"k", value).type == "t" * n


@pytest.mark.parametrize("n", [0, 255, 256, 65535, 65536])
def test_bin_forms_round_trip(n):
    _, value, _ = env.encode_event("k", "t", b"x" * n, "i", ts=-1)
    ev = env.decode("k", value)
    assert ev.payload == b"x" * n and ev.ts == -1


def test_headers_are_the_h_map():
    _, value, _ = env.encode_event("k", "t", b"", "i", {"a": "1", "b": ""}, ts=5)
    assert value[0] == 0x86  # a sixth field
    assert env.decode("k", value).headers == {"a": "1", "b": ""}


def test_payload_packs_as_keylane_publish_packs_json():
    # JSON's values: the smallest int, float64, str, array, map in order
    value = {"b": [1, -1, 200, -200, 70000, 2**40, 1.5, None, True, "s"], "a": {}}
    assert env.pack_payload(value) == msgpack.packb(value, use_bin_type=True)
    assert env.pack_payload(value)[:3] == b"\x82\xa1b"
    assert env.pack_payload(b"raw") == b"raw"
    assert env.pack_payload(bytearray(b"raw")) == b"raw"


@pytest.mark.parametrize(
    "kwargs,says",
    [
        ({"key": ""}, "message has no key; the entity key is required, 1..1024 bytes"),
        ({"key": "k" * 1025}, "message key is 1025 bytes, the limit is 1024"),
        ({"key": "é" * 513}, "message key is 1026 bytes, the limit is 1024"),
        ({"event_type": ""}, 'envelope field "t" is empty'),
        ({"event_type": "t" * 256}, 'envelope field "t" is 256 bytes, the limit is 255'),
        ({"event_id": ""}, 'envelope field "id" is empty'),
        ({"event_id": "i" * 256}, 'envelope field "id" is 256 bytes, the limit is 255'),
        ({"event_id": "a\0b"}, 'envelope field "id" holds a NUL at byte 1'),
        ({"event_id": b"\xff"}, 'envelope field "id" is not valid UTF-8 at byte 0'),
        (
            {"event_id": "~events/0/1/0"},
            "id \"~events/0/1/0\" begins with '~', which keylane keeps for the ids it derives for "
            "follow-up events: choose an id that does not (or omit it to have one made)",
        ),
        ({"payload": b"x" * (env.PAYLOAD_MAX + 1)}, 'envelope field "p" is 1046529 bytes, the limit is 1046528'),
        ({"payload": object()}, "the payload cannot be packed as msgpack"),
        ({"headers": {"": "v"}}, "header 0 has an empty name"),
        ({"headers": {"n" * 256: "v"}}, "header 0's name is 256 bytes, the limit is 255"),
        ({"headers": {"n": "v" * 4097}}, 'header "n" value is 4097 bytes, the limit is 4096'),
        ({"headers": {str(i): "" for i in range(65)}}, 'envelope field "h" has 65 headers, the limit is 64'),
        ({"headers": {"traceparent": "00-abc"}}, 'header traceparent "00-abc" is not a W3C traceparent'),
        ({"headers": {"tracestate": "x\n"}}, "header tracestate is 2 bytes or holds a character outside"),
    ],
)
def test_refusals_name_the_field_and_the_limit(kwargs, says):
    args = {"key": "k", "event_type": "t", "payload": b"", "event_id": "i"}
    args.update(kwargs)
    with pytest.raises(EventError) as e:
        env.encode_event(args.pop("key"), args.pop("event_type"), **args)
    assert says in str(e.value)


def test_record_over_the_kafka_limit_is_refused():
    headers = {"h%02d" % i: "v" * 4096 for i in range(10)}
    with pytest.raises(EventError, match=r"as a Kafka record \(key 1024 \+ envelope .*make the payload"):
        env.encode_event("k" * 1024, "t", b"x" * env.PAYLOAD_MAX, "i", headers)


def test_a_valid_traceparent_passes():
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert env.traceparent_valid(tp)
    assert not env.traceparent_valid(tp.upper())
    assert not env.traceparent_valid("00-" + "0" * 32 + "-00f067aa0ba902b7-01")
    assert not env.traceparent_valid("ff" + tp[2:])
    assert env.traceparent_valid("01" + tp[2:] + "-later")
    env.encode_event("k", "t", b"", "i", {"traceparent": tp, "tracestate": "a=b"})


def test_decoder_refuses_what_the_worker_refuses():
    good = {"v": 1, "id": "i", "t": "t", "ts": 1, "p": b""}

    def refused(value, says):
        with pytest.raises(EventError) as e:
            env.decode("k", value)
        assert says in str(e.value)

    refused(b"", "message value is empty")
    refused(msgpack.packb([1]), "it must be a map")
    refused(msgpack.packb(dict(good, x=1)), 'a field "x" that version 2 does not define (v, id, t, ts, p, h, nb)')
    refused(msgpack.packb(dict(good, v=3)), 'envelope version "v" is 3, this build reads versions 1 to 2')
    refused(msgpack.packb(dict(good, v=0)), 'envelope version "v" is 0')
    # "nb" is version 2's, a positive int
    refused(msgpack.packb(dict(good, nb=5)), 'the field "nb" (not before) but version 1, which lacks it')
    for bad in (0, -5, None, "5", 1.5):
        refused(msgpack.packb(dict(good, v=2, nb=bad)), 'envelope field "nb" is a msgpack')
    refused(msgpack.packb(dict(good, v=2, nb=2**64 - 1)), 'envelope field "nb" is 18446744073709551615, the limit')
    assert env.decode("k", msgpack.packb(dict(good, v=2))).not_before == 0
    refused(msgpack.packb({k: v for k, v in good.items() if k != "ts"}), 'lacks the required field "ts"')
    refused(msgpack.packb(dict(good, p="text")), 'envelope field "p" is a msgpack str, it must be a bin')
    refused(b"\x86" + msgpack.packb(good)[1:] + b"\xa1v\x01", 'envelope field "v" appears twice')
    refused(msgpack.packb(good) + b"\x00", "not one msgpack value")
    with pytest.raises(EventError, match="message has no key"):
        env.decode(b"", msgpack.packb(good))
    # a follow-up's id, which only keylane makes, decodes; so does a due
    # timer's type (the worker, not the decoder, judges who wrote it)
    assert env.decode("k", msgpack.packb(dict(good, id="~t/0/1/0"))).id == "~t/0/1/0"
    assert env.decode("k", msgpack.packb(dict(good, v=2, t="~timer", nb=9))).type == "~timer"


def test_delayed_encoding_is_the_c_encoders_bytes():
    # Written out by hand from event/envelope.c: fixmap 6, "v" 2, the
    # version 1 fields in their order, then "nb" uint64 last.
    _, value, _ = env.encode_event("acct-1", "credit", {"amount": 5}, "id-1", ts=1700000000000, not_before=1700000900000)
    want = (
        b"\x86\xa1v\x02\xa2id\xa4id-1\xa1t\xa6credit\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5\x68\x00"
        b"\xa1p\xc4\x09\x81\xa6amount\x05\xa2nb\xcf\x00\x00\x01\x8b\xcf\xf3\x23\xa0"
    )
    assert value == want
    ev = env.decode("acct-1", value)
    assert ev.not_before == 1700000900000 and ev.ts == 1700000000000
    # after the headers, and in its smallest form
    _, value, _ = env.encode_event("k", "t", b"", "i", {"a": "1"}, ts=0, not_before=200)
    assert value == b"\x87\xa1v\x02\xa2id\xa1i\xa1t\xa1t\xa2ts\x00\xa1p\xc4\x00\xa1h\x81\xa1a\xa11\xa2nb\xcc\xc8"
    # none, or a delay of 0: exactly version 1's bytes
    for kw in ({}, {"delay": 0}, {"delay": datetime.timedelta(0)}):
        _, value, _ = env.encode_event("k", "t", b"", "i", ts=0, **kw)
        assert value == b"\x85\xa1v\x01\xa2id\xa1i\xa1t\xa1t\xa2ts\x00\xa1p\xc4\x00"


def test_not_before_from_a_time_or_a_delay():
    utc = datetime.timezone.utc
    at = datetime.datetime(2026, 1, 1, tzinfo=utc)
    assert env.not_before_ms(at) == 1767225600000
    assert env.not_before_ms(at.astimezone(datetime.timezone(datetime.timedelta(hours=2)))) == 1767225600000
    assert env.not_before_ms(1767225600000) == 1767225600000
    assert env.not_before_ms(delay=900, now=1000) == 901000
    assert env.not_before_ms(delay=0.25, now=1000) == 1250
    assert env.not_before_ms(delay=datetime.timedelta(minutes=15), now=1000) == 901000
    before = env.now_ms()
    nb = env.not_before_ms(delay=60)
    assert before + 60000 <= nb <= env.now_ms() + 60000
    assert env.not_before_ms() == 0


@pytest.mark.parametrize(
    "kwargs,says",
    [
        ({"not_before": 1767225600000, "delay": 60}, "both not_before and delay are given: pass one"),
        ({"not_before": 0}, "not_before is 0: give a positive int, ms since the Unix epoch"),
        ({"not_before": -1}, "not_before is -1: give a positive int"),
        ({"not_before": 2**63}, "not_before is 9223372036854775808: give a positive int"),
        ({"not_before": 1.7e12}, "not_before is 1700000000000.0: give a positive int"),
        ({"not_before": True}, "not_before is True"),
        ({"not_before": datetime.datetime(2026, 1, 1)}, "is a naive datetime: give an aware one"),
        (
            {"not_before": datetime.datetime(1969, 1, 1, tzinfo=datetime.timezone.utc)},
            "is not after the Unix epoch",
        ),
        ({"delay": -1}, "delay is -1, before now: give a delay of 0 or more"),
        ({"delay": datetime.timedelta(seconds=-1)}, "before now"),
        ({"delay": "15m"}, "delay is '15m': give seconds (an int or float) or a timedelta"),
        ({"delay": float("nan")}, "delay is nan"),
        ({"delay": float("inf")}, "ends after the year 292 million"),
    ],
)
def test_not_before_refusals_say_what_to_give(kwargs, says):
    with pytest.raises(EventError) as e:
        env.encode_event("k", "t", b"", "i", **kwargs)
    assert says in str(e.value)


def test_reserved_types_are_refused():
    # '~' types are kept for keylane's own records
    says = "type \"~timer\" begins with '~', which keylane keeps for its own records"
    with pytest.raises(EventError) as e:
        env.encode_event("k", "~timer", b"", "i", not_before=5)
    assert says in str(e.value)
    with pytest.raises(EventError) as e:
        env.encode("i", "~timer", 1, b"", not_before=5)
    assert says in str(e.value)
    assert env.decode(b"k", env.encode("i", "a~", 1, b"")).type == "a~"


def test_ids_are_uuidv7_and_only_grow_across_threads():
    ids = []

    def make():
        ids.extend(env.make_id() for _ in range(3000))

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 12000
    for i in ids[:50]:
        u = uuid.UUID(i)
        assert u.version == 7 and u.variant == uuid.RFC_4122 and str(u) == i
    one = [env.make_id() for _ in range(5000)]
    assert one == sorted(one)


def test_ids_keep_growing_when_the_clock_steps_back():
    ids = env._Ids()
    a = ids.make(1_700_000_000_500)
    b = ids.make(1_700_000_000_000)
    assert b > a


def test_low_level_encode_refuses_a_reserved_id():
    # A '~' id is keylane's own (a follow-up's): a worker dead-letters a
    # record that carries one it did not derive, so the encoder that skips
    # the other checks does not write one either.
    with pytest.raises(EventError, match="begins with '~', which keylane keeps"):
        env.encode("~events/0/1/0", "credit", 1, b"")
    assert env.decode(b"k", env.encode("a~b", "credit", 1, b"")).id == "a~b"


def test_encode_event_makes_an_id_and_returns_it():
    key, value, event_id = env.encode_event(b"k", "t", {"a": 1})
    assert key == b"k" and env.decode(key, value).id == event_id and len(event_id) == 36


def test_a_forked_child_makes_ids_of_its_own():
    import os

    env.make_id()  # the parent's pool is filled
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, env.make_id().encode())
        os._exit(0)
    mine = env.make_id()
    os.waitpid(pid, 0)
    theirs = os.read(r, 64).decode()
    # the same ms is likely; the random tails must differ
    assert mine[-12:] != theirs[-12:]


def test_check_not_before_gives_each_case_of_kl_publish_word_for_word():
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "clients", "not_before_cases.json")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert len(doc["cases"]) >= 10
    for i, c in enumerate(doc["cases"]):
        try:
            env.check_not_before(c["not_before"], doc["now_ms"], c["max_ms"])
            got = None
        except EventError as e:
            got = str(e)
        assert got == c["error"], "case %d (%d)" % (i, c["not_before"])
