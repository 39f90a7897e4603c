#!/usr/bin/env bash
# Test programs leave no temporary directory when they pass: each of
# PROGRAMS runs with TMPDIR set to a fresh directory that must be empty
# after (kl_t_tmpdir() makes its directories there). /tmp once held 645
# keylane-test-* directories of passing runs.
set -uo pipefail
BUILD=${KEYLANE_BUILD_DIR:?}
# test_config_file ran a worker from a file and left three; test_store_lmdb
# makes one per contract case.
PROGRAMS=(test_config_file test_store_lmdb)
status=0
for p in "${PROGRAMS[@]}"; do
  T=$(mktemp -d /tmp/keylane-tmpdirs-XXXXXX)
  if ! TMPDIR=$T "$BUILD/bin/$p" >"$T.log" 2>&1; then
    echo "FAILED: $p did not pass (its output: $T.log; its directories: $T)" >&2
    status=1
    continue
  fi
  left=$(ls -A "$T")
  if [ -n "$left" ]; then
    echo "FAILED: $p passed and left in its TMPDIR: $left ($T; each is named" \
      "by a \"kept\" line in $T.log)" >&2
    status=1
    continue
  fi
  rmdir "$T"
  rm -f "$T.log"
done
[ $status -eq 0 ] && echo "test_tmpdirs: ${PROGRAMS[*]} left no directory"
exit $status
