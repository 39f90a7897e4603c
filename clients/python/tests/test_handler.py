"""keylane.handler: answers, the seq echo, outcomes, emits and their
checks, and the loop as the worker drives it (a child on pipes)."""
import datetime
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from keylane.handler import Event, Fail, Fence, Retry, handler

REQ = {
    "seq": 7,
    "topic": "events",
    "key": "acct-1",
    "id": "id-1",
    "type": "credit",
    "ts": 1700000000000,
    "partition": 3,
    "offset": 42,
    "epoch": 5,
    "payload": {"amount": 5},
}


def test_the_event_and_its_fence():
    seen = []

    @handler
    def apply(event, tx):
        seen.append((event, tx.fence))

    assert apply.answer(REQ) == {"seq": 7, "status": "ok"}
    event, fence = seen[0]
    assert fence == event.fence == Fence("events", 3, 5, 42)
    assert (event.key, event.id, event.type, event.ts, event.payload) == ("acct-1", "id-1", "credit", 1700000000000, {"amount": 5})
    assert (event.topic, event.partition, event.epoch, event.offset) == ("events", 3, 5, 42)
    assert event.traceparent is None and event.key_bytes == b"acct-1"


def test_b64_key_and_payload_are_bytes():
    req = dict(REQ, key_b64="/w==", payload_b64="AAE=")
    del req["key"], req["payload"]
    ev = Event(req)
    assert ev.key == b"\xff" and ev.payload == b"\x00\x01" and ev.key_bytes == b"\xff"


@pytest.mark.parametrize(
    "raise_,status,error",
    [
        (Fail("no such account"), "fail", "no such account"),
        (Retry("db busy"), "retry", "db busy"),
        (ValueError("boom"), "retry", "ValueError: boom"),
    ],
)
def test_exceptions_are_the_outcome(raise_, status, error, capsys):
    @handler
    def apply(event, tx):
        tx.emit("k", "t")  # not sent: only "ok" emits
        raise raise_

    assert apply.answer(REQ) == {"seq": 7, "status": status, "error": error}
    if status == "retry" and "ValueError" in error:
        assert "Traceback" in capsys.readouterr().err


def test_a_returned_value_is_not_taken_for_ok():
    @handler
    def apply(event, tx):
        return "fail"

    a = apply.answer(REQ)
    assert a["status"] == "retry" and "return None (ok), or raise Retry or Fail" in a["error"]


def test_emits_go_with_ok():
    @handler
    def apply(event, tx):
        tx.emit("acct-2", "credit", {"amount": 5, "from": event.key})
        tx.emit("acct-3", "raw", b"\x00\xff", topic="other")
        tx.emit("acct-4", "empty")
        tx.emit("acct-5", "null", None)

    assert apply.answer(REQ)["emit"] == [
        {"key": "acct-2", "type": "credit", "payload": {"amount": 5, "from": "acct-1"}},
        {"key": "acct-3", "type": "raw", "topic": "other", "payload_b64": "AP8="},
        {"key": "acct-4", "type": "empty"},
        {"key": "acct-5", "type": "null", "payload": None},
    ]


def test_cancels_go_with_ok():
    """tx.cancel() reaches the answer as "cancel": [{"id"}], with "ok"
    only; the event's own key may be named, another key fails the event."""

    @handler
    def apply(event, tx):
        tx.cancel("release-order-17")
        tx.cancel("r\u00e9serve", key=event.key)
        if event.type == "retry":
            raise Retry("later")

    assert apply.answer(REQ) == {
        "seq": 7,
        "status": "ok",
        "cancel": [{"id": "release-order-17"}, {"id": "r\u00e9serve"}],
    }
    assert "cancel" not in apply.answer(dict(REQ, type="retry"))


@pytest.mark.parametrize(
    "args, kwargs, says",
    [
        (("",), {}, 'cancel: "id" is 0 bytes; an event\'s id is 1 to 255 bytes'),
        (("x" * 256,), {}, 'cancel: "id" is 256 bytes'),
        (("a\x00b",), {}, 'cancel: "id" holds a NUL byte'),
        ((17,), {}, 'cancel: "id" must be the delayed event\'s id, a string, not 17'),
        (("t-1",), {"key": "acct-2"}, "cancel: key 'acct-2' is not the event's ('acct-1')"),
    ],
)
def test_a_cancel_keylane_would_refuse_fails_the_event(args, kwargs, says):
    @handler
    def apply(event, tx):
        tx.cancel("fine")
        tx.cancel(*args, **kwargs)

    answer = apply.answer(REQ)
    assert answer["status"] == "fail" and "cancel" not in answer
    assert answer["error"].startswith(says), answer["error"]


def test_at_most_64_cancels_per_event():
    @handler
    def apply(event, tx):
        for i in range(event.payload["n"]):
            tx.cancel("t-%d" % i)

    assert len(apply.answer(dict(REQ, payload={"n": 64}))["cancel"]) == 64
    answer = apply.answer(dict(REQ, payload={"n": 65}))
    assert answer["status"] == "fail"
    assert answer["error"].startswith("cancel: more than 64 timers in one event")


def test_delayed_emits_and_events():
    """An emit's not_before or delay reaches the answer as "not_before" (ms
    since the epoch); a delayed event's request carries its own."""
    utc = datetime.timezone.utc

    @handler
    def apply(event, tx):
        assert event.not_before == event.request.get("not_before", 0)
        tx.emit("acct-2", "release", not_before=1767225600000)
        tx.emit("acct-3", "release", not_before=datetime.datetime(2026, 1, 1, tzinfo=utc))
        tx.emit("acct-4", "release", delay=datetime.timedelta(minutes=15))
        tx.emit("acct-5", "now", delay=0)

    before = int(time.time() * 1000)
    emits = apply.answer(dict(REQ, not_before=1767225600000))["emit"]
    after = int(time.time() * 1000)
    assert emits[:2] == [
        {"key": "acct-2", "type": "release", "not_before": 1767225600000},
        {"key": "acct-3", "type": "release", "not_before": 1767225600000},
    ]
    assert before + 900000 <= emits[2]["not_before"] <= after + 900000
    assert emits[3] == {"key": "acct-5", "type": "now"}  # no delay: none
    assert apply.answer(REQ)["status"] == "ok"


@pytest.mark.parametrize(
    "args,kwargs,says",
    [
        (("", "t"), {}, '"key" must be a non-empty string'),
        (("k", ""), {}, '"type" must be a non-empty string'),
        (("k" * 1025, "t"), {}, '"key" is 1025 bytes, the limit is 1024'),
        (("k", "t" * 256), {}, '"type" is 256 bytes, the limit is 255'),
        (("k\0", "t"), {}, '"key" holds a NUL'),
        (("k", "t"), {"topic": "events.dlq"}, "is a dead-letter topic (*.dlq)"),
        (("k", "t"), {"topic": "__consumer_offsets"}, "is internal to Kafka (__*)"),
        (("k", "t"), {"topic": "a b"}, "has a character Kafka does not allow"),
        (("k", "t"), {"topic": "x" * 250}, "is not a Kafka topic name"),
        (("k", "t", object()), {}, "the payload is not a JSON value"),
        (("k", "t", float("nan")), {}, "emit: payload is nan, which JSON cannot carry"),
        (("k", "t", {"amount": float("inf")}), {}, "emit: payload['amount'] is inf, which JSON cannot carry"),
        (("k", "t", {"a": [1, {"b": -float("inf")}]}), {}, "emit: payload['a'][1]['b'] is -inf"),
        (("k", "t"), {"not_before": 5, "delay": 1}, "emit: both not_before and delay are given"),
        (("k", "t"), {"not_before": 0}, "emit: not_before is 0: give a positive int"),
        (("k", "t"), {"not_before": datetime.datetime(2026, 1, 1)}, "is a naive datetime"),
        (("k", "t"), {"delay": -1}, "emit: delay is -1, before now"),
    ],
)
def test_an_emit_keylane_would_refuse_fails_the_event(args, kwargs, says):
    @handler
    def apply(event, tx):
        tx.emit("fine", "t")
        tx.emit(*args, **kwargs)

    a = apply.answer(REQ)
    assert a["status"] == "fail" and says in a["error"] and "emit" not in a


def test_no_seq_no_echo_and_a_broken_request_fails():
    @handler
    def apply(event, tx):
        pass

    req = dict(REQ)
    del req["seq"]
    assert apply.answer(req) == {"status": "ok"}
    a = apply.answer({"seq": 3, "topic": "t"})
    assert a["seq"] == 3 and a["status"] == "fail" and "a request without its" in a["error"]


@pytest.mark.parametrize(
    "drop,names",
    [("id", '"id" field'), ("type", '"type" field'), ("key", '"key" (or "key_b64") field'), ("epoch", '"epoch" field')],
)
def test_a_request_without_a_field_names_it(drop, names):
    @handler
    def apply(event, tx):
        pass

    req = dict(REQ)
    del req[drop]
    a = apply.answer(req)
    assert a["status"] == "fail" and a["error"].startswith("keylane.handler: a request without its " + names + ":")


def test_a_huge_malformed_request_gets_a_short_answer():
    @handler
    def apply(event, tx):
        pass

    req = dict(REQ, key_b64="A" * 5_000_001)  # not base64: a padding error
    del req["key"]
    a = apply.answer(req)
    assert a["status"] == "fail" and "a request with a malformed field" in a["error"]
    assert len(a["error"]) < 600 and "characters)" in a["error"]
    req = dict(REQ, payload={"blob": "x" * 5_000_000})
    del req["id"]
    a = apply.answer(req)
    assert len(a["error"]) < 600 and '"id" field' in a["error"]


def test_the_answer_to_a_nan_emit_is_valid_json():
    @handler
    def apply(event, tx):
        tx.emit("k", "t", {"amount": float("nan")})

    line = apply._line(json.dumps(REQ).encode())
    a = json.loads(line, parse_constant=lambda c: pytest.fail("invalid JSON constant %s in %r" % (c, line)))
    assert a["status"] == "fail" and "payload['amount'] is nan" in a["error"]


CHILD = textwrap.dedent(
    """
    import os, sys
    from keylane.handler import handler, Fail

    @handler
    def apply(event, tx):
        print("a print goes to stderr", event.id)
        os.system("echo a child process too")
        if event.type == "bad":
            raise Fail("refused " + event.id)
        tx.emit(event.key + "-copy", "copy")

    apply.run()
    """
)


def test_the_loop_answers_pipelined_lines_in_order():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    lines = []
    for i in range(1, 21):
        lines.append(json.dumps(dict(REQ, seq=i, id="id-%d" % i, type="bad" if i % 5 == 0 else "credit")))
    lines.append('{"seq":21,"topic":')  # broken: answered by its seq
    out, err = child.communicate(("\n".join(lines) + "\n").encode(), timeout=30)
    answers = [json.loads(line) for line in out.decode().splitlines()]
    assert [a["seq"] for a in answers] == list(range(1, 22))
    for a in answers[:20]:
        if a["seq"] % 5 == 0:
            assert a == {"seq": a["seq"], "status": "fail", "error": "refused id-%d" % a["seq"]}
        else:
            assert a == {"seq": a["seq"], "status": "ok", "emit": [{"key": "acct-1-copy", "type": "copy"}]}
    assert answers[20]["status"] == "fail"
    assert b"a print goes to stderr id-1" in err and b"a child process too" in err
    assert child.returncode == 0


def test_a_traced_event_runs_in_a_child_of_its_publishers_span():
    trace = pytest.importorskip("opentelemetry.trace")
    seen = []

    @handler
    def apply(event, tx):
        seen.append(trace.get_current_span().get_span_context().trace_id)

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert apply.answer(dict(REQ, traceparent=tp, tracestate="a=b"))["status"] == "ok"
    assert apply.answer(REQ)["status"] == "ok"
    assert seen[0] == 0x4BF92F3577B34DA6A3CE929D0E0E4736 and seen[1] == 0


def test_run_echoes_seq_on_plain_oks(tmp_path):
    @handler
    def apply(event, tx):
        pass

    requests = tmp_path / "in"
    requests.write_text("".join(json.dumps(dict(REQ, seq=i)) + "\n" for i in range(1, 6)) + "\n")
    answers = tmp_path / "out"
    with open(requests, "rb") as fin, open(answers, "wb") as fout:
        apply.run(stdin=fin.fileno(), stdout=fout.fileno())
    assert answers.read_text() == "".join('{"seq":%d,"status":"ok"}\n' % i for i in range(1, 6))
