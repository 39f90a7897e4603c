#!/usr/bin/env bash
# Ends and reports the processes a test run left behind: those whose
# executable lies under one of DIRS, or whose command line names one of
# them (a Kafka or PostgreSQL a fixture started from there). Every test ends
# what it starts, also when it fails; `make test` runs this last, so that a
# test that does not is a failure, not a process found an hour later.
#   tests/support/leftovers.sh DIR...
# Exit 0 when none was running; 1 after ending those that were (each named
# with its command line and working directory).
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: leftovers.sh DIR..." >&2; exit 2; }
dirs=()
for d in "$@"; do
  [ -d "$d" ] && dirs+=("$(cd "$d" && pwd -P)")
done
found=()
for proc in /proc/[0-9]*; do
  pid=${proc#/proc/}
  [ "$pid" = $$ ] && continue
  exe=$(readlink "$proc/exe" 2>/dev/null) || continue
  args=$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null) || continue
  for d in "${dirs[@]}"; do
    case "$exe" in "$d"/*) ;; *) case "$args" in *"$d"/*) ;; *) continue ;; esac ;; esac
    found+=("$pid")
    echo "leftovers.sh: pid $pid outlived its test: $args(cwd $(readlink "$proc/cwd" 2>/dev/null))" >&2
    break
  done
done
[ ${#found[@]} -eq 0 ] && { echo "leftovers.sh: no process left running under ${dirs[*]}"; exit 0; }
kill -KILL "${found[@]}" 2>/dev/null
echo "leftovers.sh: ended ${#found[@]} process(es) that tests left running" >&2
exit 1
