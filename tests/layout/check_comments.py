#!/usr/bin/env python3
"""A comment names only files that exist: after a move, a comment that
still points at the old file sends the reader nowhere. Every file name in
a comment of the C sources and headers, the Python and shell scripts and
the CMake files (store/backend.h, worker/apply.c, pg_txn.c,
support/cluster.h) must be a file of the repository. A path with a folder
is looked up from the commenting file's folder, each folder above it and
include/ (the include path); one whose first folder is none of these is
another project's (librdkafka/rdkafka.h) and is left alone. A bare name
is looked up in every folder. Fails naming the file, its line, the name
and the nearest existing files."""
import difflib
import io
import os
import re
import sys
import tokenize

# The kinds of file a comment may name: those of this repository.
NAMED = ("c", "h", "py", "sh", "md", "go", "cmake")
NAME = re.compile(r"(?<![\w./<>-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:"
                  + "|".join(NAMED) + r"))(?![\w/-])")
# Files of other projects that comments cite by their bare name.
OTHERS = {
    "rdmurmur2.c": "librdkafka",
    "rdkafka_mock_cgrp.c": "librdkafka",
    "kafka-run-class.sh": "Apache Kafka",
    "app.py": "a user's handler, in the Python client's example",
    "libpq-fe.h": "libpq",
}


def tracked(root):
    """Yields the path (from @p root) of every file of the tree, without
    hidden folders and build trees (build*/ at the top, any folder holding
    a CMakeCache.txt)."""
    for dirpath, dirs, names in os.walk(root):
        top = os.path.relpath(dirpath, root) == "."
        dirs[:] = sorted(
            d for d in dirs
            if not d.startswith(".") and d != "__pycache__"
            and not (top and d.startswith("build"))
            and not os.path.exists(os.path.join(dirpath, d, "CMakeCache.txt")))
        for name in sorted(names):
            yield os.path.relpath(os.path.join(dirpath, name), root)


def c_comments(text):
    """Yields (line, text) for each /* */ and // comment, past strings."""
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if text.startswith("/*", i) or text.startswith("//", i):
            end = "*/" if text[i + 1] == "*" else "\n"
            j = text.find(end, i + 2)
            j = n if j < 0 else j + len(end)
            yield line, text[i:j]
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] not in (c, "\n"):
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            j = i + 1
        line += text.count("\n", i, j)
        i = j


def hash_comments(text):
    """Yields (line, text) for each # comment of a shell or CMake file: a #
    at the start of a word, outside quotes."""
    for no, line in enumerate(text.split("\n"), 1):
        quote = None
        for i, ch in enumerate(line):
            if quote:
                quote = None if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
                yield no, line[i:]
                break


def py_comments(text):
    """Yields (line, text) for each # comment and triple-quoted string (the
    docstrings) of a Python file."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT or (
                tok.type == tokenize.STRING and tok.string.endswith(
                    ('"""', "'''"))):
            yield tok.start[0], tok.string


def comments_of(path):
    """The comment reader for @p path, or None for a kind not checked."""
    name = os.path.basename(path)
    if name.endswith((".c", ".h")):
        return c_comments
    if name.endswith(".py"):
        return py_comments
    if name.endswith((".sh", ".cmake", ".cmake.in")) or name in (
            "CMakeLists.txt", "Makefile"):
        return hash_comments
    return None


def bases(root, path):
    """The folders a path named in @p path's comments is looked up from."""
    out, d = [], os.path.dirname(path)
    while True:
        out.append(d)
        if not d:
            break
        d = os.path.dirname(d)
    return out + ["include"]


def resolve(root, path, name, names):
    """None when @p name, named in a comment of @p path, is a file (or is
    another project's); else the repository files it may have meant."""
    if "/" not in name:
        if name in names or name in OTHERS:
            return None
        return near(name, names)
    first = name.split("/", 1)[0]
    dirs = [b for b in bases(root, path)
            if os.path.isdir(os.path.join(root, b, first))]
    if not dirs:
        return None  # not a folder of ours: another project's path
    if any(os.path.isfile(os.path.join(root, b, name)) for b in dirs):
        return None
    return sorted(names.get(os.path.basename(name), [])) or near(name, names)


def near(name, names):
    """The files @p name may have meant: the move into folders turned a
    flat name into a folder and a name (store/pg.c was the worker's
    store_pg), so a file is also known by its folder and name joined
    with _."""
    known = {}
    for base, paths in names.items():
        for p in paths:
            known.setdefault(base, set()).add(p)
            folder = os.path.basename(os.path.dirname(p))
            known.setdefault(f"{folder}_{base}", set()).add(p)
    flat = os.path.basename(name)
    out = []
    for key in difflib.get_close_matches(flat, sorted(known), 3, 0.8):
        out += sorted(known[key] - set(out))
    return out[:3]


def check(root):
    paths = list(tracked(root))
    names = {}
    for p in paths:
        names.setdefault(os.path.basename(p), []).append(p)
    bad = []
    for path in paths:
        reader = comments_of(path)
        if not reader:
            continue
        with open(os.path.join(root, path), encoding="utf-8",
                  errors="replace") as f:
            text = f.read()
        try:
            found = list(reader(text))
        except (tokenize.TokenError, SyntaxError) as e:
            bad.append(f"{path}: cannot read its comments ({e})")
            continue
        for line, comment in found:
            for k, part in enumerate(comment.split("\n")):
                for m in NAME.finditer(part):
                    near = resolve(root, path, m.group(1), names)
                    if near is None:
                        continue
                    hint = (f"name where it is now ({', '.join(near)}?)"
                            if near else "name a file that exists, or say "
                            "what it holds")
                    bad.append(f"{path}:{line + k}: the comment names "
                               f"{m.group(1)}, which is no file of the "
                               f"repository: {hint}")
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    bad = check(root)
    for b in bad:
        print("FAILED: " + b)
    if bad:
        print(f"{len(bad)} comment(s) name a file that does not exist")
        return 1
    print("ok: every file a comment names exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
