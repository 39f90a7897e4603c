#!/usr/bin/env python3
"""A keylane exec handler in Python that uses the fence against SQLite.

    keylane worker ... --handler 'exec:python3 handler_fence_sqlite.py /var/lib/app.db'

keylane writes one JSON line per event on stdin (seq, topic, key, id, type,
ts, partition, offset, epoch, payload or payload_b64) and reads one JSON line
per event on stdout: {"seq": N, "status": "ok" | "retry" | "fail",
"error": "..."}. Echoing the request's seq ties the answer to its event, and
lets keylane send the next events before this one is answered (up to
worker.exec.window); this handler still takes them one by one.
Logs go to stderr (keylane puts them in its own log). Standard library only.

The effects live in this database, not in keylane's store, so the handler
must itself refuse what a deposed owner sends. Each event runs in ONE
SQLite transaction that:

1. reads the last epoch stored for (topic, partition) in `fence`;
   an event whose epoch is OLDER is from a worker that has lost the
   partition: nothing is written and the answer is "retry" with
   error "fenced". Not "fail": "fail" would send the event to the
   dead-letter topic, but the event is fine - its new owner applies it.
   The stale worker's own store commit is fenced too, so it never
   records the event as done; "retry" just keeps it from acting.
2. raises the stored epoch to the event's (a new owner fences the old one
   out as soon as it writes once);
3. skips an event whose id is already in `applied` (keylane may deliver an
   event again after a crash or a restart of this process: answered "ok",
   not applied twice);
4. applies the effect: a "credit"/"debit" with payload {"amount": N} moves
   the key's balance; any other type is answered "fail" (dead letter).

A malformed line is answered "fail"; a database error (locked, I/O)
"retry". The database path is argv[1] (default handler.db).
"""
import json
import sqlite3
import sys

SCHEMA = """
CREATE TABLE IF NOT EXISTS fence (
  topic TEXT NOT NULL, partition INTEGER NOT NULL, epoch INTEGER NOT NULL,
  last_offset INTEGER NOT NULL, PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS applied (id TEXT PRIMARY KEY, epoch INTEGER,
  partition INTEGER, offset INTEGER);
CREATE TABLE IF NOT EXISTS balance (key TEXT PRIMARY KEY,
  amount INTEGER NOT NULL);
"""


def handle(db, ev):
    topic, part, epoch = ev["topic"], int(ev["partition"]), int(ev["epoch"])
    with db:  # one transaction: commit on return, roll back on exception
        row = db.execute("SELECT epoch FROM fence WHERE topic=? AND partition=?",
                         (topic, part)).fetchone()
        if row and epoch < row[0]:
            return {"status": "retry",
                    "error": "fenced: epoch %d is older than %d stored for "
                             "partition %d" % (epoch, row[0], part)}
        db.execute("INSERT INTO fence VALUES (?,?,?,?) ON CONFLICT(topic, "
                   "partition) DO UPDATE SET epoch=excluded.epoch, "
                   "last_offset=excluded.last_offset",
                   (topic, part, epoch, int(ev["offset"])))
        if db.execute("SELECT 1 FROM applied WHERE id=?",
                      (ev["id"],)).fetchone():
            return {"status": "ok"}
        kind = ev.get("type")
        payload = ev.get("payload")
        if kind not in ("credit", "debit") or not isinstance(payload, dict):
            raise ValueError("unknown event type %r (credit or debit with "
                             "{\"amount\": N})" % kind)
        amount = int(payload.get("amount", 0))
        if kind == "debit":
            amount = -amount
        db.execute("INSERT INTO balance VALUES (?,?) ON CONFLICT(key) DO "
                   "UPDATE SET amount=amount+excluded.amount",
                   (ev["key"], amount))
        db.execute("INSERT INTO applied VALUES (?,?,?,?)",
                   (ev["id"], epoch, part, int(ev["offset"])))
    return {"status": "ok"}


def main():
    db = sqlite3.connect(sys.argv[1] if len(sys.argv) > 1 else "handler.db",
                         isolation_level=None, timeout=5)
    db.executescript(SCHEMA)
    db.isolation_level = "DEFERRED"
    for line in sys.stdin:
        seq = None
        try:
            ev = json.loads(line)
            seq = ev.get("seq") if isinstance(ev, dict) else None
            answer = handle(db, ev)
        except sqlite3.Error as e:
            answer = {"status": "retry", "error": "sqlite: %s" % e}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            answer = {"status": "fail", "error": "bad event: %s" % e}
        if seq is not None:
            answer["seq"] = seq
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
