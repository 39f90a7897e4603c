#!/usr/bin/env bash
# selftest.sh: checks kafka.sh end to end on this machine and times it.
#
# 1 node: fetch, start, a 6-partition topic, kcat (librdkafka) producing
# with acks=all and enable.idempotence, two kcat -G members rebalancing
# cooperatively, committed offsets, rdkafka_check.c (when librdkafka-dev and
# cc are present), Kafka's own ConsoleConsumer, a start that must fail
# cleanly. 3 nodes: RF 3 topic, kill a node, produce with min ISR 2, restart
# it, ISR back to 3. Ends with "N passed, N failed".
#
# Uses its own data directories under a temporary directory and base port
# ${KEYLANE_KAFKA_SELFTEST_PORT:-29092}, so a cluster on the default ports is
# not disturbed. Takes about 2 minutes; every step is bounded.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K=$HERE/kafka.sh
PORT=${KEYLANE_KAFKA_SELFTEST_PORT:-29092}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keylane-kafka-selftest.XXXXXX")
D1=$WORK/one D3=$WORK/three
passed=0 failed=0

finish() {
  "$K" clean --dir "$D1" >/dev/null 2>&1
  "$K" clean --dir "$D3" >/dev/null 2>&1
  rm -rf "$WORK"
}
trap finish EXIT

ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

# timed NAME CMD...: runs CMD, prints its wall time, counts pass or fail.
timed() {
  local what=$1 t0 rc
  shift
  t0=$(date +%s.%N)
  "$@" >"$WORK/last.out" 2>"$WORK/last.err"
  rc=$?
  local dt
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  if [ $rc -eq 0 ]; then ok "$what ($(printf '%.1f' "$dt")s)"; else
    bad "$what (rc $rc, $(printf '%.1f' "$dt")s)"
    tail -n 20 "$WORK/last.err"
  fi
  return $rc
}

# The bracket keeps pgrep from matching a shell whose command line holds the pattern.
no_jvm() { ! pgrep -f "kafka[.]Kafka $1/" >/dev/null; }

keys() { seq "$1" "$2" | sed 's/.*/k&:v&/'; }

kcat_produce() { # BOOTSTRAP TOPIC FROM TO
  keys "$3" "$4" | timeout 90 kcat -P -b "$1" -t "$2" -K: -X acks=all \
    -X enable.idempotence=true -X message.timeout.ms=60000 2>"$WORK/produce.err" &&
    ! grep -q 'Delivery failed' "$WORK/produce.err"
}

# All keys of a topic from the beginning, one per line.
kcat_keys() { timeout 60 kcat -C -b "$1" -t "$2" -o beginning -e -q -f '%k\n'; }

group_lag_zero() { # BOOTSTRAP GROUP
  local lag
  lag=$("$K" run-class org.apache.kafka.tools.consumer.group.ConsumerGroupCommand \
    --bootstrap-server "$1" --describe --group "$2" 2>/dev/null |
    awk '$1 == "'"$2"'" { n++; s += $6 } END { if (n) print s; else print "none" }')
  echo "  group $2 total lag: $lag"
  [ "$lag" = 0 ]
}

# start_nodes N DIR NAME: starts N nodes in DIR (timed as NAME) and sets
# the caller's b to their bootstrap string.
start_nodes() {
  timed "$3" "$K" start --nodes "$1" --dir "$2" --base-port "$PORT" || return
  b=$(tail -n 1 "$WORK/last.out")
}

one_node() {
  local b
  start_nodes 1 "$D1" "start 1 node" || return
  check "bootstrap string is 127.0.0.1:$PORT" [ "$b" = "127.0.0.1:$PORT" ]
  timed "topic create t6 --partitions 6" "$K" topic create t6 --partitions 6 --dir "$D1"
  check "t6 has 6 partitions" bash -c "'$K' topic describe t6 --dir '$D1' | grep -c 'Partition: ' | grep -qx 6"
  timed "kcat produce 1000, acks=all, idempotent" kcat_produce "$b" t6 1 1000
  check "kcat reads back 1000 distinct keys" bash -c "$(declare -f kcat_keys); kcat_keys '$b' t6 | sort -u | wc -l | grep -qx 1000"
  kcat_group "$b"
  if command -v cc >/dev/null && [ -f /usr/include/librdkafka/rdkafka.h ]; then
    "$K" topic create rdk --partitions 6 --dir "$D1" >/dev/null
    check "rdkafka_check.c builds" cc -std=c11 -Wall -Wextra -Werror -o "$WORK/rdkafka_check" \
      "$HERE/rdkafka_check.c" -lrdkafka
    timed "rdkafka_check: idempotent produce, cooperative group, sync commit" \
      "$WORK/rdkafka_check" "$b" rdk 5000 && sed 's/^/  /' "$WORK/last.out"
  else
    echo "skip rdkafka_check.c (needs cc and librdkafka-dev)"
  fi
  timed "ConsoleConsumer reads 10 messages" "$K" console-consumer --dir "$D1" --topic t6 \
    --from-beginning --max-messages 10 --timeout-ms 30000 --formatter-property print.key=true
  check "ConsoleConsumer printed 10 lines" [ "$(wc -l <"$WORK/last.out")" = 10 ]
  timed "stop 1 node" "$K" stop --dir "$D1"
  timed "start again on the same data" "$K" start --nodes 1 --dir "$D1" --base-port "$PORT"
  check "data survived the restart" bash -c "$(declare -f kcat_keys); kcat_keys '$b' t6 | wc -l | grep -qx 1200"
  timed "stop 1 node" "$K" stop --dir "$D1"
  check "start with a bad --config fails" bash -c "! '$K' start --nodes 1 --dir '$D1' --base-port $PORT --config num.io.threads=many >'$WORK/bad.out' 2>&1"
  check "and says why" grep -q 'num.io.threads' "$WORK/bad.out"
  check "and leaves no JVM behind" no_jvm "$D1"
  "$K" clean --dir "$D1" >/dev/null 2>&1
}

# Two kcat -G members: the first takes all 6 partitions, the second joins
# and the cooperative-sticky assignor moves 3 by incremental revoke; new
# messages are then split between them, none twice; the group's lag is 0.
kcat_group() {
  local b=$1 opts=(-X partition.assignment.strategy=cooperative-sticky -X auto.offset.reset=earliest
    -X auto.commit.interval.ms=500 -X debug=cgrp -f '%k\n')
  timeout 18 kcat -b "$b" -G g1 "${opts[@]}" t6 >"$WORK/c1.out" 2>"$WORK/c1.err" &
  local c1=$!
  sleep 4
  timeout 14 kcat -b "$b" -G g1 "${opts[@]}" t6 >"$WORK/c2.out" 2>"$WORK/c2.err" &
  local c2=$!
  sleep 8
  kcat_produce "$b" t6 1001 1200
  wait $c1 $c2
  check "group: first member revoked 3 partitions incrementally" grep -q 'incremental revoke of 3 partition' "$WORK/c1.err"
  check "group: second member got an incremental assignment" grep -q 'incremental assignment of 3 partition' "$WORK/c2.err"
  check "group: 1200 messages consumed, none twice" bash -c "cat '$WORK/c1.out' '$WORK/c2.out' | sort | uniq | wc -l | grep -qx 1200 && [ \$(cat '$WORK/c1.out' '$WORK/c2.out' | wc -l) = 1200 ]"
  check "group: second member consumed some of the new messages" [ -s "$WORK/c2.out" ]
  check "group: committed offsets equal log end (lag 0)" group_lag_zero "$b" g1
}

isr_sizes() { # prints the ISR size of every partition of TOPIC
  "$K" topic describe "$1" --dir "$D3" | sed -n 's/.*Isr: \([0-9,]*\).*/\1/p' | awk -F, '{print NF}'
}

isr_all() { # TOPIC N: every partition has N in-sync replicas
  local sizes
  sizes=$(isr_sizes "$1")
  [ -n "$sizes" ] && [ -z "$(grep -vx "$2" <<<"$sizes")" ]
}

wait_isr() { # TOPIC N SECONDS
  local end=$((SECONDS + $3))
  until isr_all "$1" "$2"; do ((SECONDS < end)) || return 1; sleep 1; done
}

three_nodes() {
  local b
  start_nodes 3 "$D3" "start 3 nodes" || return
  check "bootstrap lists 3 brokers" [ "$b" = "127.0.0.1:$PORT,127.0.0.1:$((PORT + 1)),127.0.0.1:$((PORT + 2))" ]
  timed "topic create f3 --partitions 6 (RF 3 default)" "$K" topic create f3 --partitions 6 --dir "$D3"
  check "f3: every partition has 3 in-sync replicas" wait_isr f3 3 30
  timed "kcat produce 1000 to RF 3, acks=all" kcat_produce "$b" f3 1 1000
  timed "kill-node 2" "$K" kill-node 2 --dir "$D3"
  check "status reports node 2 stopped" bash -c "'$K' status --dir '$D3' | grep -q 'node 2 stopped'"
  timed "kcat produce 1000 with node 2 dead (min ISR 2)" kcat_produce "$b" f3 1001 2000
  check "f3: ISR shrank to 2 everywhere" wait_isr f3 2 60
  check "2000 distinct keys readable with node 2 dead" bash -c "$(declare -f kcat_keys); kcat_keys '$b' f3 | sort -u | wc -l | grep -qx 2000"
  timed "restart-node 2" "$K" restart-node 2 --dir "$D3"
  local t0=$SECONDS
  check "f3: ISR back to 3 everywhere" wait_isr f3 3 60
  echo "  ISR recovered $((SECONDS - t0))s after restart-node returned"
  timed "kcat produce 1000 after the restart" kcat_produce "$b" f3 2001 3000
  check "3000 distinct keys" bash -c "$(declare -f kcat_keys); kcat_keys '$b' f3 | sort -u | wc -l | grep -qx 3000"
  timed "stop 3 nodes" "$K" stop --dir "$D3"
  check "no JVM left" no_jvm "$D3"
}

command -v kcat >/dev/null || { echo "selftest needs kcat (apt-get install -y kcat)"; exit 1; }
timed "fetch" "$K" fetch
one_node
three_nodes
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
