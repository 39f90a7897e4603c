#!/usr/bin/env python3
"""The data-path table of docs/design.md ("The data path") stays true:
which file and function each step of an event's way runs in, from the
publish through consume, route check, decode, dedup, the handler, the
outbox, the commit and the dead letter.

Each row is | step | where | reached from |. "where" names functions and
the file that defines them (`fn()`, `other()` in `folder/file.c`); "reached
from" names one function of an earlier row, or "—" for a program's own
call (an entry point). The check fails when
- a file the table names does not exist, or does not define a function
  the table says it does (a renamed or moved function);
- a row's functions are not reached from its "reached from" through the
  calls of the sources (a function that calls, or passes on, another
  reaches it), so the table no longer says which way an event goes;
- a row reached `through` a pointer (`a->handler`): the caller does not
  call through it, or a function of the row is never installed as a value
  (in a backend table, a handler pointer);
- "reached from" names no function of an earlier row.
Prints one line per violation naming the table's line, the function and
the fix; exits 1 if there is any.
"""
import os
import re
import sys

from check_includes import sources

FOLDERS = ["common", "event", "store", "broker", "worker", "handlers", "cli"]
DOC = "docs/design.md"
HEADING = "### The data path"
FN = re.compile(r"`(\w+)\(\)`")
WHERE = re.compile(r"((?:`\w+\(\)`(?:,\s*|\s+and\s+)?)+)\s+in\s+`([^`]+)`")
THROUGH = re.compile(r"through\s+`([^`]+)`")


def blank(text):
    """@p text with comments, strings and character constants blanked to
    spaces (newlines kept, so line numbers stay), and preprocessor lines
    dropped: what is left is code."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i) or text.startswith("//", i):
            end = "*/" if text[i + 1] == "*" else "\n"
            j = text.find(end, i + 2)
            j = n if j < 0 else j + (len(end) if end == "*/" else 0)
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] not in (text[i], "\n"):
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return re.sub(r"^[ \t]*#.*$", "", "".join(out), flags=re.M)


# "<type> name(" at the start of a line: with a body after the parameter
# list it is a definition
HEAD = re.compile(r"^(?!typedef\b|extern\b)[A-Za-z_][^;{}()=]*?\b(\w+)\s*\(",
                  re.M)


def close(code, i, o, c):
    """The index past the @p c that closes the @p o before @p i."""
    depth = 1
    while i < len(code) and depth:
        depth += {o: 1, c: -1}.get(code[i], 0)
        i += 1
    return i


def definitions(root):
    """{name: (path, line, body)} of every function the sources define,
    and {name: count} of the names used as values outside any call
    (installed in a table or a pointer)."""
    defs, values = {}, {}
    for path, text in sources(root, FOLDERS):
        code = blank(text)
        for m in HEAD.finditer(code):
            end = close(code, m.end(), "(", ")")
            rest = code[end:].lstrip()
            if not rest.startswith("{"):
                continue
            start = len(code) - len(rest)
            body = code[start:close(code, start + 1, "{", "}")]
            defs.setdefault(m.group(1), (path, code.count(
                "\n", 0, m.start(1)) + 1, body))
        for m in re.finditer(r"\b(\w+)\b(?!\s*\()", code):
            values[m.group(1)] = values.get(m.group(1), 0) + 1
    return defs, values


def reached(defs, start):
    """The functions @p start reaches: those its body names, called or
    passed on, and theirs in turn."""
    seen, todo = {start}, [start]
    while todo:
        for name in re.findall(r"\b\w+\b", defs[todo.pop()][2]):
            if name in defs and name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def table(root):
    """Yields (line, where, reached_from, through) per row of the table:
    where is [(fn, path)], reached_from a name or None."""
    with open(os.path.join(root, DOC), encoding="utf-8") as f:
        lines = f.read().split("\n")
    if HEADING not in lines:
        raise SystemExit(f"FAILED: {DOC} has no \"{HEADING}\" section")
    rows = 0
    for no in range(lines.index(HEADING) + 1, len(lines)):
        line = lines[no]
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or set(
                cells[1]) <= set("- ") or cells[1] == "where":
            continue
        rows += 1
        where = [(fn, m.group(2)) for m in WHERE.finditer(cells[1])
                 for fn in FN.findall(m.group(1))]
        src = FN.search(cells[2])
        thr = THROUGH.search(cells[2])
        yield no + 1, where, src.group(1) if src else None, \
            thr.group(1) if thr else None
    if not rows:
        raise SystemExit(f"FAILED: {DOC}'s \"{HEADING}\" has no table rows "
                         f"of | step | where | reached from |")


def check(root):
    defs, values = definitions(root)
    bad, earlier = [], set()
    at = f"{DOC}:"
    for line, where, src, through in table(root):
        if not where:
            bad.append(f"{at}{line}: the row names no `function()` in "
                       f"`file`: say where the step runs")
        for fn, path in where:
            if not os.path.isfile(os.path.join(root, path)):
                bad.append(f"{at}{line}: {path} is no file of the "
                           f"repository: name where {fn}() is now")
            elif fn not in defs or defs[fn][0] != path:
                now = (f"it is defined in {defs[fn][0]}:{defs[fn][1]}"
                       if fn in defs else "no source defines it")
                bad.append(f"{at}{line}: {path} defines no function {fn}() "
                           f"({now}): name the function the step runs now")
        if src is None:
            earlier.update(fn for fn, _ in where)
            continue
        if src not in earlier:
            bad.append(f"{at}{line}: the row is reached from {src}(), which "
                       f"no earlier row names: name the step that calls it "
                       f"first")
        if src not in defs:
            bad.append(f"{at}{line}: no source defines {src}()")
        elif through:
            call = re.sub(r"\s+", "", through) + "("
            if call not in re.sub(r"\s+", "", defs[src][2]):
                bad.append(f"{at}{line}: {src}() ({defs[src][0]}) does not "
                           f"call through {through}: name the pointer it "
                           f"calls, or the function that does")
            for fn, _ in where:
                if fn in defs and not values.get(fn):
                    bad.append(f"{at}{line}: {fn}() is never installed as "
                               f"a value (a table's member, a handler): "
                               f"nothing calls it through {through}")
        else:
            reach = reached(defs, src)
            for fn, _ in where:
                if fn in defs and fn not in reach:
                    bad.append(f"{at}{line}: {fn}() is not reached from "
                               f"{src}() ({defs[src][0]}) through the calls "
                               f"of the sources: name the function it is "
                               f"reached from now")
        earlier.update(fn for fn, _ in where)
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    bad = check(root)
    for b in bad:
        print("FAILED: " + b)
    if bad:
        return 1
    print(f"ok: every function of {DOC}'s data path is where it says, and "
          f"reached from the step it says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
