"""The exec handler the handler test runs (tests/clients/handlers.py says
what it must do), on the keylane package's helper.

    handler_py.py LOG MARKERS [CRASH_AT]

Effects are appended to LOG as JSON lines {"id", "key", "delta"}; a child
killed after writing one and before answering writes it again on the retry,
and the verifier keeps one per id, as a resource's unique event id would.
MARKERS is a directory of files that say a one-time behaviour happened.
"""
import json
import os
import sys

from keylane.handler import Fail, Retry, handler

log = open(sys.argv[1], "a")
markers = sys.argv[2]
crash_at = int(sys.argv[3]) if len(sys.argv) > 3 else 0
seen = 0


def once(name):
    """True the first time ``name`` is asked for, across restarts."""
    path = os.path.join(markers, name)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def effect(event, key, delta):
    log.write(json.dumps({"id": event.id, "key": key, "delta": delta}) + "\n")
    log.flush()


@handler
def apply(event, tx):
    global seen
    seen += 1
    if seen == crash_at and once("crash"):
        os._exit(3)  # killed mid-batch: the events in flight are retried
    kind, p = event.type, event.payload
    if kind == "fail":
        raise Fail("refused " + event.id)
    if kind == "retry" and once("retry-" + event.id):
        raise Retry("not yet " + event.id)
    if kind == "raise" and once("raise-" + event.id):
        raise RuntimeError("a bug on the first try of " + event.id)
    if kind in ("credit", "retry", "raise"):
        effect(event, event.key, p["amount"])
    elif kind == "debit":
        effect(event, event.key, -p["amount"])
    elif kind == "transfer":
        effect(event, event.key, -p["amount"])
        tx.emit(p["to"], "credit", {"amount": p["amount"], "from": event.key})
    elif kind == "cancel":
        tx.cancel(p["id"])
    else:
        raise Fail("unknown type " + kind)


apply.run()
