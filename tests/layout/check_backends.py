#!/usr/bin/env python3
"""The store interface is the only way to a backend (docs/design.md,
"Layout"): outside store/ no file calls libpq (PQ...) or LMDB (mdb_...),
includes their headers (<libpq-fe.h>, <libpq-events.h>, <lmdb.h>) or a
backend's own (store/pg*.h, store/lmdb*.h, store/backend.h). What the
engine needs of one backend alone is an operation of the backend table
(store/backend.h), called through store/store_internal.h.

Exceptions, and why: handlers/ may call libpq on the connection that the
public kl_txn_pg_conn() lends, as an embedder's handler would (it still
may not include store/'s backend headers); tests/ is not read, since a
test reaches the backend it tests (a server's admin session, an LMDB file
of an old format). Comments and strings are not read either.
Fails naming the file, its line, what it uses and the fix."""
import re
import sys

from check_includes import sources

FOLDERS = ["include", "common", "event", "broker", "worker", "handlers", "cli"]
# What only a backend file may include: path -> the backend it belongs to.
BACKEND_INCLUDE = re.compile(
    r'^\s*#\s*include\s+(?:"(store/(?:pg|lmdb)[^"]*\.h|store/backend\.h)"'
    r"|<(libpq-fe\.h|libpq-events\.h|lmdb\.h)>)", re.M)
CALL = re.compile(r"\b(PQ[A-Za-z]+|mdb_[a-z_]+)\s*\(")
# handlers/ may use what kl_txn_pg_conn() lends: libpq, not store/.
HANDLER_OK = re.compile(r"^(?:libpq-fe\.h|libpq-events\.h|PQ[A-Za-z]+)$")


def strip(text):
    """@p text with its comments and string and character literals blanked,
    newlines kept, so that line numbers stay true."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def check(root):
    bad = []
    for path, text in sources(root, FOLDERS):
        handlers = path.startswith("handlers/")
        for m in BACKEND_INCLUDE.finditer(text):
            header = m.group(1) or m.group(2)
            if handlers and HANDLER_OK.match(header):
                continue
            no = text.count("\n", 0, m.start()) + 1
            bad.append(
                f"{path}:{no}: includes {header}, which only the store's "
                f"backends in store/ may: call the store interface "
                f"(store/store_internal.h, keylane/store.h); what one "
                f"backend alone can do becomes an operation of the backend "
                f"table in store/backend.h")
        code = strip(text)
        for m in CALL.finditer(code):
            fn = m.group(1)
            if handlers and HANDLER_OK.match(fn):
                continue
            lib = "libpq" if fn.startswith("PQ") else "LMDB"
            no = code.count("\n", 0, m.start()) + 1
            bad.append(
                f"{path}:{no}: calls {fn}() ({lib}) outside store/: only "
                f"the backend in store/ talks to {lib}; add an operation "
                f"to the backend table (store/backend.h) and call it "
                f"through store/store_internal.h")
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    bad = check(root)
    for line in bad:
        print("FAILED: " + line)
    if bad:
        print(f"{len(bad)} use(s) of a store backend outside store/")
        return 1
    print("ok: no file outside store/ calls libpq or LMDB or includes a "
          "backend's header (handlers/ use only the PGconn they are lent)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
