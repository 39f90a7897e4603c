#!/usr/bin/env python3
"""The docs as transcript tests: every shell block of README.md and
docs/*.md becomes part of a prysk test file (.t), one per page, which
tests/docs/test_docs.sh runs. prysk runs a page's commands in one shell, in
order, and compares what they print with what the page shows.

- A ```console block is a transcript: "$ command" lines ("> " continues
  one) are run, and the lines after each are the output it must print. A
  "…" in an output line matches anything (prysk's glob).
- A ```sh (or bash, shell) block is run as it is, in the page's shell (its
  variables stay for the next blocks); it must end with status 0.
- The line before a block may say <!-- docs-test: skip (REASON) --> (not
  run, counted with its reason) or <!-- docs-test: run by PATH --> (run by
  another test, which must exist).

Also checks the code map: every `path` the pages name under a source folder
and every page they link to exists, and every `kl_...()` function they name
is defined in the sources.

Writes PAGE.t files and blocks/ into OUT; prints the counts as JSON.
"""
import glob
import json
import os
import re
import sys

SHELLS = {"sh", "bash", "shell"}
MARK = re.compile(r"<!--\s*docs-test:\s*(skip|run by)\s*(.*?)\s*-->")
FOLDERS = ("include", "common", "event", "store", "broker", "worker",
           "handlers", "cli", "tests", "deploy", "clients", "docs")
PATH_RE = re.compile(r"`((?:%s)/[A-Za-z0-9_./*-]*)`" % "|".join(FOLDERS))
FUNC_RE = re.compile(r"`(kl_\w+)\(\)`")
LINK_RE = re.compile(r"\]\(([^)#:]+)(?:#[^)]*)?\)")


def blocks(text):
    """(info, lines, mark) of each fenced block; mark is the docs-test
    comment on the nearest non-blank line before it, or None."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = MARK.search(lines[k]) if k >= 0 else None
        yield m.group(1), lines[i + 1:j], mark, i + 1
        i = j + 1


def glob_line(line):
    """A transcript's output line for prysk; "…" matches anything."""
    if "…" not in line:
        return "  " + line if line else ""
    esc = re.sub(r"([*?\\])", r"\\\1", line).replace("…", "*")
    return "  %s (glob)" % esc


def page_t(name, text, out, counts):
    t = ['  $ . "$KEYLANE_DOCS_ENV"']
    for info, body, mark, lineno in blocks(text):
        if info not in SHELLS and info != "console":
            continue
        where = "%s:%d" % (name, lineno)
        if mark and mark.group(1) == "skip":
            counts["skipped"].append("%s %s" % (where, mark.group(2)))
            continue
        if mark:
            target = mark.group(2)
            if not os.path.exists(os.path.join(counts["src"], target)):
                counts["errors"].append("%s: run by %s, which does not exist"
                                        % (where, target))
            counts["run_elsewhere"].append("%s by %s" % (where, target))
            continue
        counts["run"] += 1
        if info == "console":
            counts["console"] += 1
            for line in body:
                if line.startswith("$ "):
                    t.append("  $ " + line[2:])
                elif line.startswith("> "):
                    t.append("  > " + line[2:])
                else:
                    t.append(glob_line(line))
            continue
        n = counts["run"]
        path = os.path.join(out, "blocks", "%d.sh" % n)
        with open(path, "w") as f:
            f.write("# %s\n%s\n" % (where, "\n".join(body)))
        t.append('  $ . "$TESTDIR/blocks/%d.sh" > "$TESTDIR/blocks/%d.out" '
                 '2>&1; echo "%s: exit $?"' % (n, n, where))
        t.append("  %s: exit 0" % where)
    return "\n".join(t) + "\n"


def code_map(src, pages, counts):
    c_files = [f for d in FOLDERS[:8] for f in
               glob.glob(os.path.join(src, d, "**", "*.c"), recursive=True)]
    defs = set()
    for f in c_files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                m = re.match(r"^[A-Za-z_][\w \*]*?\b(kl_\w+)\(", line)
                if m:
                    defs.add(m.group(1))
    for name, text in pages:
        for p in set(PATH_RE.findall(text)):
            counts["paths"] += 1
            if not glob.glob(os.path.join(src, p.rstrip("/"))):
                counts["errors"].append("%s names `%s`, which does not exist"
                                        % (name, p))
        for link in set(LINK_RE.findall(text)):
            counts["paths"] += 1
            if not os.path.exists(os.path.join(src, os.path.dirname(name),
                                               link)):
                counts["errors"].append("%s links to %s, which does not "
                                        "exist" % (name, link))
        for fn in set(FUNC_RE.findall(text)):
            counts["functions"] += 1
            if fn not in defs:
                counts["errors"].append("%s names `%s()`, which no source "
                                        "file defines" % (name, fn))


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(out, "blocks"), exist_ok=True)
    names = ["README.md"] + sorted(
        os.path.relpath(p, src) for p in glob.glob(os.path.join(src, "docs",
                                                                "*.md")))
    counts = {"src": src, "run": 0, "console": 0, "skipped": [],
              "run_elsewhere": [], "paths": 0, "functions": 0, "errors": [],
              "pages": []}
    pages = []
    for name in names:
        with open(os.path.join(src, name), encoding="utf-8") as f:
            text = f.read()
        pages.append((name, text))
        t = os.path.join(out, name.replace("/", "_") + ".t")
        before = counts["run"]
        with open(t, "w") as f:
            f.write(page_t(name, text, out, counts))
        if counts["run"] > before:
            counts["pages"].append(t)
        else:
            os.unlink(t)
    code_map(src, pages, counts)
    del counts["src"]
    json.dump(counts, sys.stdout)
    print()


if __name__ == "__main__":
    main()
