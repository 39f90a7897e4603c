#!/bin/sh
# test_interop.sh's ConsoleConsumer check, without a broker: a consumer
# passes only when it printed the published keys at their partitions and
# offsets AND exited 0 (one that prints them and then fails must not).
set -eu
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
. "$here/../kafka/console_check.sh"
tmp=$(mktemp -d /tmp/keylane-console-check-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok() { echo "$*" >"$tmp/said"; passed=$((passed + 1)); }
bad() { echo "$*" >"$tmp/said"; failed=$((failed + 1)); }
printf 'pub-01\t0\t0\npub-02\t3\t0\npub-03\t3\t1\n' >"$tmp/want.tsv"
# The formatter's fields, in its order and in another.
printf 'Partition:3\tOffset:0\tpub-02\nPartition:0\tOffset:0\tpub-01\nPartition:3\tOffset:1\tpub-03\n' >"$tmp/all.out"
printf 'Offset:0\tPartition:3\tpub-02\nOffset:0\tPartition:0\tpub-01\nOffset:1\tPartition:3\tpub-03\n' >"$tmp/reordered.out"
printf 'Partition:3\tOffset:0\tpub-02\nPartition:0\tOffset:0\tpub-01\n' >"$tmp/short.out"
printf 'Processed a total of 3 messages\n' >"$tmp/console.err"
bad_cases=0
expect() { # OUT STATUS PASSED FAILED: the counts after checking OUT, STATUS
  passed=0 failed=0
  console_check "$tmp/want.tsv" "$tmp/$1.out" "$tmp/console.err" "$2"
  if [ "$passed $failed" = "$3 $4" ]; then
    echo "ok: $1, exit status $2: passed $passed, failed $failed"
  else
    echo "FAILED: $1, exit status $2: passed $passed, failed $failed; expected $3, $4: $(cat "$tmp/said")" >&2
    bad_cases=1
  fi
}
expect all 0 1 0
expect reordered 0 1 0
expect short 0 0 1
expect all 1 0 1
expect all 124 0 1
expect all 134 0 1
grep -q 'exited with status 134' "$tmp/said" ||
  { echo "FAILED: the message does not name the exit status: $(cat "$tmp/said")" >&2; bad_cases=1; }
exit $bad_cases
