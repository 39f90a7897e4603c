#!/usr/bin/env python3
"""The layout's rule (docs/design.md, "Layout"): each folder is one concern,
and an #include "folder/..." points only at a folder the table below allows,
so dependencies run one way and no two folders include each other. Fails
naming the file, its line, the include and the rule it breaks."""
import os
import re
import sys

# folder -> the folders its files may include (besides keylane/, the public
# API in include/keylane, which any folder may include).
ALLOWED = {
    "include": set(),
    "common": {"common"},
    "event": {"common", "event"},
    "store": {"common", "event", "store"},
    "broker": {"common", "event", "broker"},
    "worker": {"common", "event", "store", "worker"},
    "handlers": {"common", "event", "handlers"},
    "cli": {"common", "event", "store", "broker", "worker", "handlers", "cli"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(path):
    return path.split("/", 1)[0]


def sources(root, folders):
    """Yields the path (from @p root) and text of each .c and .h file in
    @p folders."""
    for folder in folders:
        top = os.path.join(root, folder)
        for dirpath, _, names in os.walk(top):
            for name in sorted(names):
                if not name.endswith((".c", ".h")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    yield path, f.read()


def check(root):
    bad = []
    for path, text in sources(root, ALLOWED):
        folder = folder_of(path)
        for no, line in enumerate(text.split("\n"), 1):
            m = INCLUDE.match(line)
            if not m or "/" not in m.group(1):
                continue
            target = folder_of(m.group(1))
            if target == "keylane" or target in ALLOWED[folder]:
                continue
            if target not in ALLOWED:
                continue  # a system header in quotes
            bad.append(
                f"{path}:{no}: includes \"{m.group(1)}\": {folder}/ "
                f"may include only "
                f"{', '.join(sorted(ALLOWED[folder] | {'keylane'}))}"
                f" ({target}/ depends on {folder}/ or is its peer: "
                f"move the code or the declaration to the lower folder)")
    return bad


def cycles():
    """The table itself must be acyclic between folders."""
    seen, stack = set(), []

    def visit(f):
        if f in stack:
            return stack[stack.index(f):] + [f]
        if f in seen:
            return None
        stack.append(f)
        for g in sorted(ALLOWED[f] - {f}):
            c = visit(g)
            if c:
                return c
        stack.pop()
        seen.add(f)
        return None

    for f in sorted(ALLOWED):
        c = visit(f)
        if c:
            return c
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    loop = cycles()
    if loop:
        print("FAILED: the layout table has a loop: " + " -> ".join(loop))
        return 1
    bad = check(root)
    for line in bad:
        print("FAILED: " + line)
    if bad:
        print(f"{len(bad)} include(s) against the layout")
        return 1
    print("ok: every #include points down the layout table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
