#!/usr/bin/env bash
# Checks C files against the repository's .clang-format with clang-format-14
# (Debian's; other versions format differently), changing nothing.
#   tests/format-check.sh [FILE...]   default: every tracked *.c and *.h
# Installs clang-format-14 (deploy/install-deps.sh --test) when missing.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if ! command -v clang-format-14 >/dev/null 2>&1; then
  deploy/install-deps.sh --test
fi
if [ $# -eq 0 ]; then
  mapfile -t files < <(git ls-files '*.c' '*.h')
else
  files=("$@")
fi
bad=0
for f in "${files[@]}"; do
  clang-format-14 --dry-run -Werror "$f" >/dev/null 2>&1 || {
    echo "not formatted: $f (fix: clang-format-14 -i $f)"
    bad=$((bad + 1))
  }
done
echo "format-check: $((${#files[@]} - bad)) passed, $bad failed"
[ "$bad" -eq 0 ]
