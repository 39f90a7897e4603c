# check NAME PROGRAM: PROGRAM passes when it prints exactly "KL_EFENCED ok"
# and exits 0; a wrong line or a nonzero exit status (a crash at exit, a
# failed teardown) counts in $failed, with both in the message. Sourced by
# test_install.sh, and by tests/deploy/test_install_check.sh, its test.
passed=${passed:-0} failed=${failed:-0}
check() {
  status=0
  out=$("$2" 2>&1) || status=$?
  if [ "$status" -eq 0 ] && [ "$out" = "KL_EFENCED ok" ]; then
    passed=$((passed + 1))
  else
    echo "FAILED: the $1 build printed: $out (exit status $status)" >&2
    failed=$((failed + 1))
  fi
}
