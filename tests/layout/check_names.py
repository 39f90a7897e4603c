#!/usr/bin/env python3
"""The naming rules of the sources (STYLE: "Names explain themselves"):
a static function does not carry the public kl_ prefix, and no static
function name is defined in two files (the same name twice is either the
same code, to be written once, or two things that deserve two names).
Fails naming the file, its line, the name and the fix."""
import re
import sys

from check_includes import sources

FOLDERS = ["common", "event", "store", "broker", "worker", "handlers", "cli"]
# "static <type> name(": a definition or a declaration, on one or more
# lines; not "static <type> (*name)(": a pointer to a function
STATIC_FN = re.compile(r"^static\b[^;{}()=]*?\b([A-Za-z_]\w*)\s*\((?!\s*\*)", re.M)


def statics(root):
    """Yields (path, line, name) for each static function of the tree."""
    for path, text in sources(root, FOLDERS):
        seen = set()
        for m in STATIC_FN.finditer(text):
            fn = m.group(1)
            if fn not in seen:
                seen.add(fn)
                yield path, text.count("\n", 0, m.start(1)) + 1, fn


def check(root):
    bad, where = [], {}
    for path, line, fn in statics(root):
        if fn.startswith("kl_") and not fn.startswith("kl__"):
            bad.append(f"{path}:{line}: static function {fn} has the public "
                       f"kl_ prefix: drop it ({fn[3:]}) or use the file's "
                       f"short name")
        where.setdefault(fn, []).append(f"{path}:{line}")
    for fn, places in sorted(where.items()):
        if len(places) > 1:
            bad.append(f"{places[1]}: static function {fn} is defined again "
                       f"(first at {places[0]}): share the code when it is "
                       f"the same, or rename one")
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    bad = check(root)
    for b in bad:
        print(b)
    if bad:
        sys.exit(1)
    print("ok: no static kl_ function, no static name defined twice")


if __name__ == "__main__":
    main()
