#!/usr/bin/env python3
"""A keylane exec handler in Python that uses the fence against SQLite.

    keylane worker ... --handler 'exec:python3 handler_fence_sqlite.py /var/lib/app.db'

Written on the keylane package's handler helper (clients/python,
docs/clients-python.md): `apply(event, tx)` is called once per event, and
its outcome is the answer: returning is "ok", raising Retry "retry",
raising Fail "fail" (a dead letter); any other exception is "retry". The
JSON-lines protocol, the "seq" echo and pipelining are the helper's. Runs
from a checkout without installing anything (standard library only).

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
3. skips an event whose (topic, key, id) is already in `applied` (keylane
   may deliver an event again after a crash or a restart of this process:
   answered "ok", not applied twice). Ids are scoped by topic and entity
   key, as keylane's own are: the same id on two keys names two events,
   each applied once. A database from before that scoping keeps its rows
   (topic and key '') and they still suppress their id on every key;
4. applies the effect: a "credit"/"debit" with payload {"amount": N} moves
   the key's balance; a "transfer" {"to": KEY, "amount": N} debits the key
   and emits a "credit" {"amount": N, "from": KEY} to KEY "to", which
   keylane publishes after this event is committed (its outbox); any other
   type is answered "fail" (dead letter).

A database error (locked, I/O) is "retry". The database path is argv[1]
(default handler.db).
"""
import os
import sqlite3
import sys

try:
    from keylane.handler import Fail, Retry, handler
except ImportError:  # a checkout without `pip install ./clients/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))
    from keylane.handler import Fail, Retry, handler

SCHEMA = """
CREATE TABLE IF NOT EXISTS fence (
  topic TEXT NOT NULL, partition INTEGER NOT NULL, epoch INTEGER NOT NULL,
  last_offset INTEGER NOT NULL, PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS applied (topic TEXT NOT NULL, key TEXT NOT NULL,
  id TEXT NOT NULL, epoch INTEGER, partition INTEGER, offset INTEGER,
  PRIMARY KEY (topic, key, id));
CREATE TABLE IF NOT EXISTS balance (key TEXT PRIMARY KEY,
  amount INTEGER NOT NULL);
"""

db = None  # the connection main() opens


# `applied` before ids were scoped: keyed by id alone. Its rows move to the
# scoped table with topic and key '' (unknown), which match every key.
MIGRATE_APPLIED = """
BEGIN IMMEDIATE;
ALTER TABLE applied RENAME TO applied_unscoped;
CREATE TABLE applied (topic TEXT NOT NULL, key TEXT NOT NULL,
  id TEXT NOT NULL, epoch INTEGER, partition INTEGER, offset INTEGER,
  PRIMARY KEY (topic, key, id));
INSERT INTO applied SELECT '', '', id, epoch, partition, offset
  FROM applied_unscoped;
DROP TABLE applied_unscoped;
COMMIT;
"""


def connect(path):
    conn = sqlite3.connect(path, isolation_level=None, timeout=5)
    columns = [row[1] for row in conn.execute("PRAGMA table_info(applied)")]
    if columns and "key" not in columns:
        conn.executescript(MIGRATE_APPLIED)
    conn.executescript(SCHEMA)
    conn.isolation_level = "DEFERRED"
    return conn


def amount_of(event):
    payload = event.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("amount"), int):
        raise Fail('%s needs a payload {"amount": N}, got %r' % (event.type, payload))
    return payload["amount"]


def move(key, amount):
    db.execute(
        "INSERT INTO balance VALUES (?,?) ON CONFLICT(key) DO UPDATE SET amount=amount+excluded.amount",
        (key, amount),
    )


@handler
def apply(event, tx):
    topic, part, epoch, offset = tx.fence
    try:
        with db:  # one transaction: commit on return, roll back on exception
            row = db.execute("SELECT epoch FROM fence WHERE topic=? AND partition=?", (topic, part)).fetchone()
            if row and epoch < row[0]:
                raise Retry("fenced: epoch %d is older than %d stored for partition %d" % (epoch, row[0], part))
            db.execute(
                "INSERT INTO fence VALUES (?,?,?,?) ON CONFLICT(topic, partition) DO UPDATE SET "
                "epoch=excluded.epoch, last_offset=excluded.last_offset",
                (topic, part, epoch, offset),
            )
            if db.execute(
                "SELECT 1 FROM applied WHERE id=? AND ((topic=? AND key=?) OR topic='')",
                (event.id, topic, event.key),
            ).fetchone():
                return
            if event.type == "credit":
                move(event.key, amount_of(event))
            elif event.type == "debit":
                move(event.key, -amount_of(event))
            elif event.type == "transfer":
                to = event.payload.get("to") if isinstance(event.payload, dict) else None
                if not isinstance(to, str) or to == event.key:
                    raise Fail('transfer needs {"to": another key, "amount": N}, got %r' % (event.payload,))
                move(event.key, -amount_of(event))
                tx.emit(to, "credit", {"amount": amount_of(event), "from": event.key})
            else:
                raise Fail('unknown event type %r (credit, debit with {"amount": N}, or transfer)' % event.type)
            db.execute("INSERT INTO applied VALUES (?,?,?,?,?,?)", (topic, event.key, event.id, epoch, part, offset))
    except sqlite3.Error as e:
        raise Retry("sqlite: %s" % e) from None


def main():
    global db
    db = connect(sys.argv[1] if len(sys.argv) > 1 else "handler.db")
    apply.run()


if __name__ == "__main__":
    main()
