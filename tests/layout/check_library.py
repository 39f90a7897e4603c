#!/usr/bin/env python3
"""libkeylane.so holds its API and nothing more (issue 38).

Usage: check_library.py SRC LIBRARY.so ARCHIVE.a

- What the library exports (nm -D) is what include/keylane/*.h declares
  with KL_EXPORT: no internal kl__ name, no name of no public header, no
  mutant of the simulator; and every KL_EXPORT declaration is exported
  (a public function defined in the tools would be missing for embedders).
- Every object of the library is reached from an exported symbol. ARCHIVE
  holds the objects the shared library is linked from (keylane_static):
  an object that no public symbol reaches, through the symbols the objects
  call, is a tool the command line runs (the gateway, replay, ...) and
  belongs in KL_TOOLS_SRC, which is linked into the executable only.

Prints one line per violation, naming the symbol or file and the fix, and
exits 1 if there is any.
"""
import os
import re
import subprocess
import sys

# Symbols a linker may define in any shared object, and the prefixes of
# those a sanitizer's instrumentation adds (AddressSanitizer exports an
# __odr_asan.NAME beside each exported variable).
LINKER_SYMBOLS = {"_init", "_fini", "_edata", "_end", "__bss_start"}
SANITIZER_PREFIXES = ("__odr_asan", "__asan_", "__ubsan_", "__tsan_",
                      "__sanitizer_")


def public_declarations(src):
    """{name: header} of every KL_EXPORT declaration of include/keylane."""
    out = {}
    inc = os.path.join(src, "include", "keylane")
    for name in sorted(os.listdir(inc)):
        if not name.endswith(".h"):
            continue
        with open(os.path.join(inc, name), encoding="utf-8") as f:
            text = re.sub(r"/\*.*?\*/|//[^\n]*|^\s*#[^\n]*", " ", f.read(),
                          flags=re.S | re.M)
        for m in re.finditer(r"\bKL_EXPORT\b([^;{]*)", text):
            decl = m.group(1)
            head = decl.split("(", 1)[0] if "(" in decl else decl
            ids = re.findall(r"[A-Za-z_]\w*", head.split("[", 1)[0])
            if ids:
                out[ids[-1]] = "include/keylane/" + name
    return out


def nm(args):
    return subprocess.run(["nm"] + args, check=True, capture_output=True,
                          text=True).stdout.splitlines()


def exports(lib):
    names = set()
    for line in nm(["-D", "--defined-only", lib]):
        parts = line.split()
        if len(parts) >= 3 and parts[-1] not in LINKER_SYMBOLS and \
                not parts[-1].startswith(SANITIZER_PREFIXES):
            names.add(parts[-1].split("@", 1)[0])
    return names


def check_exports(lib, declared):
    errors = []
    base = os.path.basename(lib)
    for sym in sorted(exports(lib)):
        if "mutant" in sym.lower():
            errors.append(
                f"{base} exports {sym}, a mutant of the simulator: compile "
                "the mutant sites into keylane-sim only (KL_MUTANT_SRC and "
                "KL_MUTANT_SITES in CMakeLists.txt, tests/CMakeLists.txt), "
                "never into a KL_*_SRC list")
        elif sym.startswith("kl__"):
            errors.append(
                f"{base} exports {sym}, an internal kl__ name: drop its "
                "KL_EXPORT (the library builds with -fvisibility=hidden), or "
                "give it a public kl_ name declared in include/keylane/")
        elif sym not in declared:
            errors.append(
                f"{base} exports {sym}, which no header of include/keylane/ "
                "declares with KL_EXPORT: declare it there, or drop its "
                "KL_EXPORT so that it stays hidden")
    have = exports(lib)
    for sym, header in sorted(declared.items()):
        if sym not in have:
            errors.append(
                f"{header} declares {sym} (KL_EXPORT), which {base} does "
                "not export: define it in a file of the library's KL_*_SRC "
                "lists in CMakeLists.txt, not in KL_TOOLS_SRC or cli/")
    return errors


def members(archive):
    """{member: (defined, undefined)} of the archive's objects."""
    objs = {}
    for line in nm(["-A", archive]):
        m = re.match(r"(?:.*?):([^:]+\.o):\s*(?:[0-9a-fA-F]+)?\s+(\S)\s+(\S+)$",
                     line)
        if not m:
            continue
        member, kind, sym = m.groups()
        defined, undefined = objs.setdefault(member, (set(), set()))
        if kind == "U":
            undefined.add(sym)
        elif kind.isupper() or kind in "vw":
            defined.add(sym)
    return objs


def source_of(src, member):
    """The library's source file an archive member was compiled from."""
    base = member[:-2] if member.endswith(".o") else member
    found = []
    for d, dirs, files in os.walk(src):
        rel = os.path.relpath(d, src)
        if rel == ".":  # never a library source: tests, builds, cli/
            dirs[:] = [x for x in dirs if not x.startswith(".") and
                       x not in ("tests", "cli") and not x.startswith("build")]
        elif base in files:
            found.append(os.path.join(rel, base))
    found.sort()
    return " or ".join(found) if found else base


def check_reached(src, lib, archive):
    objs = members(archive)
    owner = {}
    for member, (defined, _) in objs.items():
        for sym in defined:
            owner.setdefault(sym, member)
    todo = [owner[s] for s in exports(lib) if s in owner]
    reached = set()
    while todo:
        member = todo.pop()
        if member in reached:
            continue
        reached.add(member)
        todo.extend(owner[s] for s in objs[member][1] if s in owner)
    return [
        f"{os.path.basename(lib)} holds {source_of(src, member)}, which "
        "nothing the public headers declare reaches: it is a tool of the "
        "keylane command, not the library's API; move it from its KL_*_SRC "
        "list to KL_TOOLS_SRC in CMakeLists.txt"
        for member in sorted(set(objs) - reached)
    ]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    src, lib, archive = sys.argv[1:]
    for path in (lib, archive):
        if not os.path.exists(path):
            sys.exit(f"FAILED: no {path}: build first "
                     "(cmake --build build), or set KEYLANE_BUILD_DIR")
    errors = check_exports(lib, public_declarations(src))
    errors += check_reached(src, lib, archive)
    for e in errors:
        print("FAILED: " + e)
    if errors:
        print(f"{len(errors)} violation(s) of the library's API boundary")
        sys.exit(1)
    print("ok: libkeylane.so exports what include/keylane declares, and "
          "holds only what that reaches")


if __name__ == "__main__":
    main()
