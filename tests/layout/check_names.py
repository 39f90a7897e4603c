#!/usr/bin/env python3
"""The naming rules of the sources: a static function does not carry the
public kl_ prefix, and no static function name is defined in two files
(the same name twice is either the same code, to be written once, or two
things that deserve two names). Names that say where a thing is say where
it is now: a header's guard spells its path, and an internal prefix named
after a file (kl__log_ for log.c) is defined in that file or one of its
parts (log_*.c), and in one folder only; the prefix of a folder's own file
(kl__store_ for store/store.c) in any file of the folder. An engine split
in files (the lanes, the gateway) has a header of its state that only its
parts read, and its parts carry its name (worker/lanes_pool.c, the lanes'
executors, reads worker/lanes_internal.h). A public header is one concept,
whose functions one folder defines (keylane/event.h's are in event/).
Fails naming the file, its line, the name and the fix."""
import os
import re
import sys

from check_includes import sources
from check_library import public_declarations

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


# --- header guards -----------------------------------------------------
GUARD = re.compile(r"^#ifndef\s+(\w+)\s*\n#define\s+(\w+)", re.M)


def folders(root):
    """The top folders of the tree, without hidden ones and build trees."""
    return sorted(d for d in os.listdir(root)
                  if os.path.isdir(os.path.join(root, d))
                  and not d.startswith((".", "build")))


def guard_of(path):
    """The guard @p path's header must have: KEYLANE_ and its path in
    capitals, / and . as _ (store/pg.h: KEYLANE_STORE_PG_H); a public
    header by its name (include/keylane/store.h: KEYLANE_STORE_H); a file
    named after its folder says the name once (cli/cli.h: KEYLANE_CLI_H,
    worker/worker_internal.h: KEYLANE_WORKER_INTERNAL_H)."""
    if path.startswith("include/keylane/"):
        path = path[len("include/keylane/"):]
    parts = path[:-len(".h")].split("/")
    if len(parts) > 1 and parts[-1] == parts[-2]:
        parts.pop()
    elif len(parts) > 1 and parts[-1].startswith(parts[-2] + "_"):
        parts[-1] = parts[-1][len(parts[-2]) + 1:]
    return "KEYLANE_" + re.sub(r"\W", "_", "_".join(parts)).upper() + "_H"


def guards(root):
    """The header guards that do not spell their header's path."""
    bad, seen = [], {}
    for path, text in sources(root, folders(root)):
        if not path.endswith(".h"):
            continue
        want = guard_of(path)
        m = GUARD.search(text)
        if not m or m.group(1) != m.group(2):
            bad.append(f"{path}:1: no header guard (#ifndef {want} then "
                       f"#define {want}): add it")
            continue
        line = text.count("\n", 0, m.start()) + 1
        if m.group(1) != want:
            bad.append(f"{path}:{line}: header guard {m.group(1)} does not "
                       f"spell the header's path: name it {want}")
        elif want in seen:
            bad.append(f"{path}:{line}: header guard {want} is also "
                       f"{seen[want]}'s: rename one of the headers")
        seen.setdefault(want, path)
    return bad


# --- internal prefixes ---------------------------------------------------
# a definition, not a declaration: "<type> kl__name(...) {" at the start
# of a line, on one or more lines
INTERNAL_FN = re.compile(
    r"^(?!static\b|typedef\b|extern\b)[A-Za-z_][^;{}()=#]*?\b(kl__\w+)\s*\(",
    re.M)


def internal_definitions(root, pattern=INTERNAL_FN):
    """Yields (path, line, name) for each non-static kl__ function (or
    each function @p pattern names)."""
    for path, text in sources(root, FOLDERS):
        for m in pattern.finditer(text):
            i, depth = m.end(), 1
            while i < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            if text[i:].lstrip().startswith("{"):
                yield path, text.count("\n", 0, m.start(1)) + 1, m.group(1)


def prefixes(root):
    """The kl__<file>_ functions defined outside <file>'s folder, or in its
    folder by a file that is neither <file> nor one of its parts
    (<file>_*.c); the folder's own prefix (kl__store_ of store/store.c) is
    any of its files'. And the prefixes a file name in two folders leaves
    ambiguous."""
    homes = {}  # a file's name without .c/.h -> {its folder: its path}
    for path, _ in sources(root, FOLDERS):
        stem, ext = os.path.splitext(os.path.basename(path))
        at = homes.setdefault(stem, {})
        if ext == ".c" or os.path.dirname(path) not in at:
            at[os.path.dirname(path)] = path
    bad, used = [], {}
    for path, line, fn in internal_definitions(root):
        folder, words = os.path.dirname(path), fn[4:].split("_")
        stems = ["_".join(words[:k]) for k in range(len(words), 0, -1)]
        named = [s for s in stems if s in homes]
        mine = [s for s in named if folder in homes[s]]
        if named and not mine:
            s = named[0]
            own = os.path.splitext(os.path.basename(path))[0]
            bad.append(f"{path}:{line}: {fn} has the prefix kl__{s}_ of "
                       f"{' and '.join(sorted(homes[s].values()))}, in "
                       f"another folder: name it after its own file "
                       f"(kl__{own}_{fn[len(s) + 5:]})")
        elif mine:
            used.setdefault(mine[0], {}).setdefault(folder, f"{path}:{line}")
            own = os.path.splitext(os.path.basename(path))[0]
            if not any(own == s or own.startswith(s + "_")
                       or s == os.path.basename(folder) for s in mine):
                s = mine[0]
                bad.append(f"{path}:{line}: {fn} has the prefix kl__{s}_ of "
                           f"{homes[s][folder]}: define it there (or in one "
                           f"of its parts, {folder}/{s}_*.c), or name it "
                           f"after its own file (kl__{own}_{fn[len(s) + 5:]})")
    for stem, where in sorted(used.items()):
        if len(where) > 1:
            first, *rest = sorted(where.values())
            files = " and ".join(sorted(homes[stem].values()))
            for w in rest:
                bad.append(f"{w}: the prefix kl__{stem}_ is also defined at "
                           f"{first}, and {files} share its name: rename "
                           f"one file and its prefix, so that the prefix "
                           f"says which folder")
    return bad


# --- an engine's parts -----------------------------------------------------
# The header of an engine's state -> the engine's name: a file that reads
# that state is one of the engine's parts and says so by its name
# (<engine>.c or <engine>_*.c, and so its functions kl__<engine>_*).
ENGINES = {
    "worker/lanes_internal.h": "lanes",
    "broker/gateway_internal.h": "gateway",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def parts(root):
    """The files that read an engine's state without carrying its name."""
    bad = []
    for path, text in sources(root, FOLDERS):
        for m in INCLUDE.finditer(text):
            engine = ENGINES.get(m.group(1))
            if not engine:
                continue
            folder, name = os.path.split(path)
            stem = os.path.splitext(name)[0]
            if stem == engine or stem.startswith(engine + "_"):
                continue
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{path}:{line}: includes {m.group(1)}, the state of "
                       f"the {engine} engine, but is not named as one of its "
                       f"parts: name it {folder}/{engine}_{stem}.c (functions "
                       f"kl__{engine}_{stem}_*), or use only what "
                       f"{folder}/{engine}.h declares")
    return bad


# --- public declarations -------------------------------------------------
# A public header is one concept, whose functions one folder defines
# (docs/design.md, "Layout"): a declaration lives where its definition
# does, so kl_partition() is in keylane/event.h, not producer.h.
PUBLIC_HOMES = {
    "event.h": "event",
    "producer.h": "broker",
    "embedded.h": "broker",
    "store.h": "store",
    "worker.h": "worker",
    "handlers.h": "handlers",
    "conf.h": "common",
    "error.h": "common",
}
PUBLIC_FN = re.compile(
    r"^(?!static\b|typedef\b|extern\b)[A-Za-z_][^;{}()=#]*?\b(kl_[a-z]\w*)\s*\(",
    re.M)


def declarations(root):
    """The public functions declared in a header of another folder's
    concept than the folder that defines them."""
    if not os.path.isdir(os.path.join(root, "include", "keylane")):
        return []
    defined = {fn: path for path, _, fn in internal_definitions(root,
                                                                PUBLIC_FN)}
    bad, homeless = [], set()
    for fn, header in sorted(public_declarations(root).items()):
        want = PUBLIC_HOMES.get(os.path.basename(header))
        if want is None:
            if header not in homeless:
                homeless.add(header)
                bad.append(f"{header}: no folder is its home: add it to "
                           f"PUBLIC_HOMES (tests/layout/check_names.py) and "
                           f"to docs/design.md's layout")
            continue
        where = defined.get(fn)
        if where and where.split("/")[0] != want:
            folder = where.split("/")[0]
            into = " or ".join(sorted(
                "keylane/" + h for h, f in PUBLIC_HOMES.items()
                if f == folder)) or f"a header of {folder}/'s concept"
            bad.append(f"{header}: declares {fn}(), which {where} defines: "
                       f"declare it in {into}, or define it in {want}/")
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    bad = (check(root) + guards(root) + prefixes(root) + parts(root) +
           declarations(root))
    for b in bad:
        print(b)
    if bad:
        sys.exit(1)
    print("ok: no static kl_ function, no static name defined twice, "
          "every header guard spells its path, "
          "every internal prefix lives in its file or its parts, "
          "every reader of an engine's state is one of its parts, "
          "every public function is declared in its folder's header")


if __name__ == "__main__":
    main()
