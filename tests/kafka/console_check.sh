# console_check WANT OUT ERR STATUS: Kafka's ConsoleConsumer, which wrote
# OUT and ERR and exited STATUS, read back what keylane published when its
# lines ("Partition:P<TAB>Offset:O<TAB>KEY", in the formatter's order, so
# the fields are taken by name) are exactly WANT's sorted "KEY<TAB>P<TAB>O"
# AND it exited 0. It does both on --max-messages and on --timeout-ms (its
# loop returns on the consumer's TimeoutException); a nonzero status is
# an unknown error (1), a JVM crash or timeout(1)'s 124, even after the
# right lines. Counts in ok/bad, which the caller defines. Sourced by
# test_interop.sh, and by tests/deploy/test_console_check.sh, its test.
console_check() {
  awk -F '\t' '{
    key = ""; p = ""; o = ""
    for (i = 1; i <= NF; i++) {
      if ($i ~ /^Partition:/) p = substr($i, 11)
      else if ($i ~ /^Offset:/) o = substr($i, 8)
      else if (key == "") key = $i
    }
    if (key != "" && p != "" && o != "") print key "\t" p "\t" o
  }' "$2" | sort >"$2.tsv"
  if [ "$4" -eq 0 ] && cmp -s "$1" "$2.tsv"; then
    ok "Kafka's ConsoleConsumer read back all $(wc -l <"$1"), same keys, partitions and offsets, and exited 0"
  else
    bad "ConsoleConsumer exited with status $4 (0 expected) and read: $(head -3 "$2" | tr '\n' ' ') / $(tail -3 "$3" | tr '\n' ' ')"
  fi
}
