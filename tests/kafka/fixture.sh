#!/usr/bin/env bash
# The ctest fixture of the kafka and fault suites: a real Apache Kafka from
# deploy/kafka/kafka.sh in a data directory of the build.
#   fixture.sh start DIR NODES BASE_PORT [--secure]
#                                          clean, then start; prints the bootstrap
#                                          (--secure: kafka.sh's TLS and SASL
#                                          listeners too)
#   fixture.sh stop DIR                    stop, then clean unless KEYLANE_TEST_KEEP
# The brokers accept the suites' 3000 ms group sessions (Kafka's floor is
# 6000 ms by default) and fence a killed broker after 3 s instead of 9.
set -euo pipefail
KAFKA=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../deploy/kafka" && pwd)/kafka.sh
cmd=${1:?start or stop}
dir=${2:?data directory}
case $cmd in
  start)
    "$KAFKA" clean --dir "$dir"
    "$KAFKA" start --nodes "${3:?nodes}" --dir "$dir" --base-port "${4:?base port}" ${5:+"$5"} \
      --config group.min.session.timeout.ms=1000 \
      --config broker.session.timeout.ms=3000
    ;;
  stop)
    "$KAFKA" stop --dir "$dir"
    if [ -z "${KEYLANE_TEST_KEEP:-}" ]; then
      "$KAFKA" clean --dir "$dir"
    else
      echo "fixture.sh: KEYLANE_TEST_KEEP is set: broker logs kept in $dir" >&2
    fi
    ;;
  *) echo "fixture.sh: want start or stop, got '$cmd'" >&2; exit 2 ;;
esac
