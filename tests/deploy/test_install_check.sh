#!/bin/sh
# test_install.sh's check: a consumer passes only when it prints the
# expected line AND exits 0 (one that prints it and then fails must not).
set -eu
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
. "$here/../install/check.sh"
tmp=$(mktemp -d /tmp/keylane-check-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prog() { # NAME LINE STATUS: a consumer that prints LINE and exits STATUS
  printf '#!/bin/sh\necho "%s"\nexit %s\n' "$2" "$3" >"$tmp/$1"
  chmod +x "$tmp/$1"
}
prog good "KL_EFENCED ok" 0
prog crashes "KL_EFENCED ok" 134
prog wrong "KL_ESTORE ok" 0
bad=0
expect() { # NAME PASSED FAILED: the counts after checking NAME
  passed=0 failed=0
  check "$1" "$tmp/$1" 2>"$tmp/$1.err"
  if [ "$passed $failed" = "$2 $3" ]; then
    echo "ok: $1: passed $passed, failed $failed"
  else
    echo "FAILED: $1: passed $passed, failed $failed; expected $2, $3" >&2
    bad=1
  fi
}
expect good 1 0
expect crashes 0 1
expect wrong 0 1
grep -q 'exit status 134' "$tmp/crashes.err" ||
  { echo "FAILED: the message does not name the exit status: $(cat "$tmp/crashes.err")" >&2; bad=1; }
exit $bad
