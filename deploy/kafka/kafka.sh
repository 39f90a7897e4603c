#!/usr/bin/env bash
# kafka.sh: a real Apache Kafka (KRaft, no ZooKeeper) for keylane's
# integration and fault tests, assembled from Maven Central jars and run with
# the machine's Java 17 on 127.0.0.1 only. `kafka.sh help` lists the commands;
# README.md beside this file explains the layout.
#
# stdout carries only results (the bootstrap string, tool output); progress
# and errors go to stderr. Every wait is bounded.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
POM=$HERE/pom.xml
PINNED_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")
KAFKA_VERSION=${KEYLANE_KAFKA_VERSION:-$PINNED_VERSION}
KAFKA_HOME=${KEYLANE_KAFKA_HOME:-${HOME:-/tmp}/.cache/keylane/kafka-$KAFKA_VERSION}
LIBS=$KAFKA_HOME/libs
DIR=${KEYLANE_KAFKA_DIR:-${TMPDIR:-/tmp}/keylane-kafka}

FETCH_TIMEOUT=${KEYLANE_KAFKA_FETCH_TIMEOUT:-600}
START_TIMEOUT=${KEYLANE_KAFKA_START_TIMEOUT:-90}
STOP_TIMEOUT=${KEYLANE_KAFKA_STOP_TIMEOUT:-30}
QUORUM_GRACE=${KEYLANE_KAFKA_QUORUM_GRACE:-3}
TOOL_TIMEOUT=${KEYLANE_KAFKA_TOOL_TIMEOUT:-60}
HEAP_OPTS=${KEYLANE_KAFKA_HEAP_OPTS:--Xms128m -Xmx512m}
# The GC settings of Kafka's own kafka-run-class.sh, plus: die on OOM rather
# than limp along, which would look like a fault the test did not inject.
BROKER_JVM_OPTS=${KEYLANE_KAFKA_JVM_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
-XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
-XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true}
# Short-lived tools start about twice as fast without the optimizing JIT.
TOOL_JVM_OPTS="-Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true"

# Port layout: broker listener of node i on BASE+i-1, its controller
# listener on BASE+100+i-1. Default 19092..19094 and 19192..19194.
DEFAULT_BASE_PORT=19092
CONTROLLER_OFFSET=100
# With --secure: a SASL_SSL listener on BASE+200+i-1, a mutual-TLS one on
# BASE+300+i-1 (the brokers talk to each other on PLAINTEXT).
SASL_SSL_OFFSET=200
MTLS_OFFSET=300

say() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

usage() {
  cat <<EOF
usage: kafka.sh COMMAND [ARGS] [--dir DATA_DIR]

  fetch                          download Kafka $KAFKA_VERSION jars into $LIBS
  start --nodes 1|3 [--base-port P] [--secure] [--config KEY=VALUE]...
                                 format (first time) and start a cluster; the
                                 last stdout line is the bootstrap string.
                                 --secure adds a SASL_SSL listener (PLAIN and
                                 SCRAM-SHA-512 users) and a mutual-TLS one,
                                 with a CA made for the cluster: DATA_DIR/
                                 tls/secure.env says where (see README.md)
  stop                           SIGTERM every node, SIGKILL after ${STOP_TIMEOUT}s
  status                         one line per node; exit 0 only if all run
  bootstrap                      print the bootstrap string
  kill-node N                    SIGKILL node N (its data stays)
  restart-node N                 start node N again on its data, wait until ready
  clean                          stop, then delete DATA_DIR
  topic create NAME --partitions N [--rf R] [--if-not-exists] [--config K=V]...
  topic describe [NAME] | topic list | topic delete NAME
  console-consumer ARGS...       org.apache.kafka.tools.consumer.ConsoleConsumer
  console-producer ARGS...       org.apache.kafka.tools.ConsoleProducer
  run-class CLASS ARGS...        any class on the Kafka classpath

DATA_DIR defaults to \$KEYLANE_KAFKA_DIR or $DIR.
The passthroughs add --bootstrap-server of DATA_DIR's cluster unless given.
EOF
}

# ---------------------------------------------------------------- fetch

fetch_stamp() { printf '%s %s\n' "$KAFKA_VERSION" "$(sha256sum "$POM" | cut -d' ' -f1)"; }

fetched() { [ -f "$LIBS/.keylane-fetched" ] && [ "$(cat "$LIBS/.keylane-fetched")" = "$(fetch_stamp)" ]; }

# Checks the copied classpath for the mistakes that make a broker fail late
# or silently: a missing main jar, two versions of one library, or an SLF4J
# 2 binding next to Kafka's SLF4J 1.7 (it then logs nothing at all).
check_libs() {
  local libs=$1 dup
  [ -f "$libs/kafka_2.13-$KAFKA_VERSION.jar" ] || { say "kafka_2.13-$KAFKA_VERSION.jar missing in $libs"; return 1; }
  [ -f "$libs/kafka-tools-$KAFKA_VERSION.jar" ] || { say "kafka-tools-$KAFKA_VERSION.jar missing in $libs"; return 1; }
  compgen -G "$libs/log4j-slf4j-impl-*.jar" >/dev/null || { say "log4j-slf4j-impl missing in $libs: the broker would log nothing"; return 1; }
  if compgen -G "$libs/log4j-slf4j2-impl-*.jar" >/dev/null || compgen -G "$libs/slf4j-api-2.*.jar" >/dev/null; then
    say "SLF4J 2 jars in $libs next to Kafka's SLF4J 1.7: fix pom.xml"; return 1
  fi
  dup=$(find "$libs" -name '*.jar' -printf '%f\n' | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9]+)?\.jar$//' | sort | uniq -d)
  [ -z "$dup" ] || { say "two versions of: $dup in $libs"; return 1; }
}

cmd_fetch() {
  fetched && { printf '%s\n' "$LIBS"; return 0; }
  mkdir -p "$KAFKA_HOME"
  exec 9>"$KAFKA_HOME/.fetch.lock"
  flock -w "$FETCH_TIMEOUT" 9 || die "another fetch holds $KAFKA_HOME/.fetch.lock for over ${FETCH_TIMEOUT}s"
  if ! fetched; then fetch_into_libs; fi
  exec 9>&-
  printf '%s\n' "$LIBS"
}

# Copies into a fresh directory and renames it into place, so an
# interrupted fetch never leaves a half-filled libs/ that looks complete.
fetch_into_libs() {
  local tmp=$KAFKA_HOME/libs.tmp.$$ log=$KAFKA_HOME/fetch.log t0=$SECONDS
  rm -rf "$tmp"
  say "fetching Kafka $KAFKA_VERSION from Maven Central into $LIBS"
  # shellcheck disable=SC2086 # KEYLANE_KAFKA_MVN_ARGS is a list of flags
  if ! timeout "$FETCH_TIMEOUT" mvn -B -q -Dstyle.color=never -f "$POM" \
      -Dkafka.version="$KAFKA_VERSION" ${KEYLANE_KAFKA_MVN_ARGS:-} \
      dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$tmp" >"$log" 2>&1 9>&-; then
    tail -n 30 "$log" >&2
    rm -rf "$tmp"
    die "mvn dependency:copy-dependencies failed or ran over ${FETCH_TIMEOUT}s (full log: $log)"
  fi
  check_libs "$tmp" || { rm -rf "$tmp"; die "fetched classpath is not usable"; }
  fetch_stamp >"$tmp/.keylane-fetched"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
  say "fetched $(find "$LIBS" -name '*.jar' | wc -l) jars ($(du -sh "$LIBS" | cut -f1)) in $((SECONDS - t0))s"
}

need_libs() { fetched || cmd_fetch >/dev/null; }

# ---------------------------------------------------------------- class-data sharing

# Most of a JVM's start is class loading. The first run of each kind
# (the broker, each tool class) dumps the classes it loaded (-XX:ArchiveClassesAtExit) and
# later runs map them (-XX:SharedArchiveFile): about 1 s off a broker start,
# 0.3 s off a tool. Archives live in libs/.cds, so a new fetch drops them,
# and carry the JDK's version in their name, since an archive fits only the
# JVM that wrote it. A truncated archive crashes the JVM instead of being
# ignored, so a dump is moved into place only after its writer has exited
# and a test JVM has mapped it. KEYLANE_KAFKA_CDS=0 turns this off.
CDS_DIR=$LIBS/.cds
CDS_KEY=''
BROKER_DUMPING=0

cds_archive() {
  [ -n "$CDS_KEY" ] || CDS_KEY=$(java -version 2>&1 | sha1sum | cut -c1-12)
  echo "$CDS_DIR/$1-$CDS_KEY.jsa"
}

# The JVM flags for KIND: map its archive, or, when there is none and DUMP
# is 1, write one at exit under a temporary name for cds_adopt.
cds_opts() {
  local kind=$1 dump=${2:-0} archive
  [ "${KEYLANE_KAFKA_CDS:-1}" = 1 ] || return 0
  archive=$(cds_archive "$kind")
  if [ -f "$archive" ]; then
    echo "-XX:SharedArchiveFile=$archive"
  elif [ "$dump" = 1 ]; then
    mkdir -p "$CDS_DIR"
    echo "-XX:ArchiveClassesAtExit=$archive.tmp.$$.$RANDOM -Xlog:cds=off -Xlog:cds+dynamic=off"
  fi
}

cds_adopt() {
  local archive t
  [ "${KEYLANE_KAFKA_CDS:-1}" = 1 ] || return 0
  archive=$(cds_archive "$1")
  for t in "$archive".tmp.*; do
    [ -f "$t" ] || continue
    pgrep -f -- "ArchiveClassesAtExit=$t" >/dev/null && continue # still being written
    if [ ! -f "$archive" ] && (cd "$CDS_DIR" && java -Xshare:on -XX:SharedArchiveFile="$t" \
        -XX:ErrorFile=/dev/null -XX:-CreateCoredumpOnCrash -cp "$LIBS/*" -version >/dev/null 2>&1 8>&-); then
      mv -f "$t" "$archive"
    else
      rm -f "$t"
    fi
  done
}

# ---------------------------------------------------------------- cluster state

# DATA_DIR/cluster.env records what `start` laid out; every other command
# reads it, so ports and node count are given once.
C_NODES='' C_BASE='' C_ID='' C_VERSION='' C_SECURE=0

load_cluster() {
  local k v
  [ -f "$DIR/cluster.env" ] || return 1
  while IFS='=' read -r k v; do
    case $k in
      nodes) C_NODES=$v ;; base_port) C_BASE=$v ;;
      cluster_id) C_ID=$v ;; version) C_VERSION=$v ;; secure) C_SECURE=$v ;;
    esac
  done <"$DIR/cluster.env"
  [[ $C_NODES =~ ^[13]$ && $C_BASE =~ ^[0-9]+$ && -n $C_ID ]] || die "$DIR/cluster.env is damaged; run: kafka.sh clean --dir $DIR"
}

require_cluster() {
  load_cluster || die "no cluster in $DIR (start one with: kafka.sh start --nodes 1 --dir $DIR)"
}

broker_port() { echo $((C_BASE + $1 - 1)); }
controller_port() { echo $((C_BASE + CONTROLLER_OFFSET + $1 - 1)); }
sasl_ssl_port() { echo $((C_BASE + SASL_SSL_OFFSET + $1 - 1)); }
mtls_port() { echo $((C_BASE + MTLS_OFFSET + $1 - 1)); }
node_dir() { echo "$DIR/node$1"; }

bootstrap() {
  local i out=''
  for ((i = 1; i <= C_NODES; i++)); do out+="${out:+,}127.0.0.1:$(broker_port "$i")"; done
  echo "$out"
}

# The pid of node i's JVM if it is running, else nothing. The command line
# must name this node's server.properties, so a recycled pid is never killed.
node_pid() {
  local nd pid
  nd=$(node_dir "$1")
  [ -f "$nd/kafka.pid" ] || return 0
  pid=$(cat "$nd/kafka.pid")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  if grep -qF "kafka.Kafka $nd/server.properties" <(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline"); then
    echo "$pid"
  fi
}

# True when DATA_DIR holds nothing but our lock file.
dir_is_empty() { [ -z "$(find "$DIR" -mindepth 1 -maxdepth 1 ! -name .lock -print -quit)" ]; }

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# Serializes commands that change a cluster. fd 8 is closed in every child
# so a broker never inherits (and holds) the lock.
lock_dir() {
  mkdir -p "$DIR"
  exec 8>"$DIR/.lock"
  flock -w $((STOP_TIMEOUT + START_TIMEOUT)) 8 || die "another kafka.sh holds $DIR/.lock"
}

# ---------------------------------------------------------------- layout

new_cluster_id() {
  # A Kafka Uuid: 16 random bytes, URL-safe base64 without padding; Kafka
  # never issues one starting with '-', so neither do we.
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
    [[ $id == -* ]] || { echo "$id"; return; }
  done
}

write_props() {
  local i=$1 rf=1 isr=1 voters='' n nd
  shift
  nd=$(node_dir "$i")
  [ "$C_NODES" = 3 ] && { rf=3; isr=2; }
  for ((n = 1; n <= C_NODES; n++)); do voters+="${voters:+,}$n@127.0.0.1:$(controller_port "$n")"; done
  mkdir -p "$nd/data" "$nd/logs"
  {
    echo "# written by deploy/kafka/kafka.sh start; node $i of $C_NODES"
    echo "process.roles=broker,controller"
    echo "node.id=$i"
    echo "controller.quorum.voters=$voters"
    if [ "$C_SECURE" = 1 ]; then
      echo "listeners=PLAINTEXT://127.0.0.1:$(broker_port "$i"),CONTROLLER://127.0.0.1:$(controller_port "$i"),SASL_SSL://127.0.0.1:$(sasl_ssl_port "$i"),SSL://127.0.0.1:$(mtls_port "$i")"
      echo "advertised.listeners=PLAINTEXT://127.0.0.1:$(broker_port "$i"),SASL_SSL://127.0.0.1:$(sasl_ssl_port "$i"),SSL://127.0.0.1:$(mtls_port "$i")"
      echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL"
      secure_props
    else
      echo "listeners=PLAINTEXT://127.0.0.1:$(broker_port "$i"),CONTROLLER://127.0.0.1:$(controller_port "$i")"
      echo "advertised.listeners=PLAINTEXT://127.0.0.1:$(broker_port "$i")"
      echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    fi
    echo "controller.listener.names=CONTROLLER"
    echo "inter.broker.listener.name=PLAINTEXT"
    echo "log.dirs=$nd/data"
    echo "num.partitions=1"
    echo "default.replication.factor=$rf"
    echo "min.insync.replicas=$isr"
    echo "offsets.topic.replication.factor=$rf"
    echo "offsets.topic.num.partitions=10"
    echo "transaction.state.log.replication.factor=$rf"
    echo "transaction.state.log.min.isr=$isr"
    echo "transaction.state.log.num.partitions=10"
    echo "share.coordinator.state.topic.replication.factor=$rf"
    echo "share.coordinator.state.topic.min.isr=$isr"
    echo "group.initial.rebalance.delay.ms=0"
    # A broker is unfenced, and its controlled shutdown granted, on a
    # heartbeat: 500 ms instead of 2 s makes start and stop seconds faster
    # and narrows the window in which stopping nodes lose the quorum.
    # The session timeout, what a fault test waits for after kill-node,
    # stays at Kafka's 9 s.
    echo "broker.heartbeat.interval.ms=500"
    # Tests create their topics with the partition count they mean.
    echo "auto.create.topics.enable=false"
    echo "unclean.leader.election.enable=false"
    # The default 128 MiB would be a quarter of a 512 MiB heap.
    echo "log.cleaner.dedupe.buffer.size=16777216"
    for kv in "$@"; do echo "$kv"; done
  } >"$nd/server.properties"
}

# ---------------------------------------------------------------- TLS and SASL

# --secure: a CA of the cluster's own, the brokers' certificate (for
# 127.0.0.1 and localhost), a client certificate for the mutual-TLS
# listener, another CA that signed nothing here (a client that trusts it
# must fail), and random passwords for the SASL users, all in DATA_DIR/tls,
# readable by the owner only. secure.env lists them for tests and scripts.
TLS_DAYS=7
SCRAM_USER=keylane-scram
PLAIN_USER=keylane-plain

tls_dir() { echo "$DIR/tls"; }

make_cert() { # NAME CN SAN: NAME.key and NAME.pem, signed by ca
  local t name=$1 cn=$2 san=$3
  t=$(tls_dir)
  openssl req -new -newkey rsa:2048 -nodes -keyout "$t/$name.key" -subj "/CN=$cn" \
    -out "$t/$name.csr" 2>/dev/null
  printf 'subjectAltName=%s\n' "$san" >"$t/$name.ext"
  openssl x509 -req -in "$t/$name.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" -CAcreateserial \
    -days "$TLS_DAYS" -extfile "$t/$name.ext" -out "$t/$name.pem" 2>/dev/null
  rm -f "$t/$name.csr" "$t/$name.ext"
}

make_tls() {
  local t ca
  t=$(tls_dir)
  [ -f "$t/secure.env" ] && return 0
  command -v openssl >/dev/null || die "--secure needs openssl: apt-get install openssl"
  (
    umask 077
    mkdir -p "$t"
    for ca in ca other-ca; do
      openssl req -x509 -newkey rsa:2048 -nodes -days "$TLS_DAYS" -subj "/CN=keylane test $ca" \
        -keyout "$t/$ca.key" -out "$t/$ca.pem" 2>/dev/null
    done
    make_cert broker localhost "IP:127.0.0.1,DNS:localhost"
    make_cert client keylane-client "DNS:keylane-client"
    cat "$t/broker.key" "$t/broker.pem" >"$t/broker-keystore.pem"
    head -c 18 /dev/urandom | base64 | tr '+/' '-_' >"$t/scram.password"
    head -c 18 /dev/urandom | base64 | tr '+/' '-_' >"$t/plain.password"
  ) || die "could not make the test CA and certificates in $t"
  write_secure_env
}

write_secure_env() {
  local t i sasl='' mtls=''
  t=$(tls_dir)
  for ((i = 1; i <= C_NODES; i++)); do
    sasl+="${sasl:+,}127.0.0.1:$(sasl_ssl_port "$i")"
    mtls+="${mtls:+,}127.0.0.1:$(mtls_port "$i")"
  done
  {
    echo "SASL_SSL_BOOTSTRAP=$sasl"
    echo "MTLS_BOOTSTRAP=$mtls"
    echo "CA=$t/ca.pem"
    echo "OTHER_CA=$t/other-ca.pem"
    echo "CLIENT_CERT=$t/client.pem"
    echo "CLIENT_KEY=$t/client.key"
    echo "SCRAM_USER=$SCRAM_USER"
    echo "SCRAM_PASSWORD_FILE=$t/scram.password"
    echo "PLAIN_USER=$PLAIN_USER"
    echo "PLAIN_PASSWORD_FILE=$t/plain.password"
  } >"$t/secure.env"
}

secure_props() {
  local t
  t=$(tls_dir)
  echo "ssl.keystore.type=PEM"
  echo "ssl.keystore.location=$t/broker-keystore.pem"
  echo "ssl.truststore.type=PEM"
  echo "ssl.truststore.location=$t/ca.pem"
  echo "listener.name.ssl.ssl.client.auth=required"
  echo "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512"
  echo "listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$PLAIN_USER=\"$(cat "$t/plain.password")\";"
  echo "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
}

tool_java() {
  local rc=0
  # shellcheck disable=SC2086,SC2046 # lists of flags
  timeout "$TOOL_TIMEOUT" java $TOOL_JVM_OPTS $(cds_opts "tool-${1##*.}" 1) \
    -Dlog4j2.configurationFile="$HERE/log4j2-tools.xml" -cp "$LIBS/*" "$@" 8>&- || rc=$?
  cds_adopt "tool-${1##*.}"
  return $rc
}

# Formats every node in parallel; -g leaves an already formatted directory
# alone, so a stopped cluster keeps its data.
format_nodes() {
  local i pids=() rc=0 nd
  for ((i = 1; i <= C_NODES; i++)); do
    nd=$(node_dir "$i")
    # shellcheck disable=SC2046 # the SCRAM user, with --secure
    tool_java kafka.tools.StorageTool format -g -t "$C_ID" -c "$nd/server.properties" \
      $([ "$C_SECURE" = 1 ] && echo --add-scram "SCRAM-SHA-512=[name=$SCRAM_USER,password=$(cat "$(tls_dir)/scram.password")]") \
      >"$nd/format.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      rc=1
      nd=$(node_dir $((i + 1)))
      say "formatting node $((i + 1)) failed:"
      tail -n 20 "$nd/format.out" >&2
    fi
  done
  return $rc
}

# ---------------------------------------------------------------- processes

require_ports_free() {
  local p
  local ports=("$(broker_port "$1")" "$(controller_port "$1")")
  [ "$C_SECURE" = 1 ] && ports+=("$(sasl_ssl_port "$1")" "$(mtls_port "$1")")
  for p in "${ports[@]}"; do
    ! port_open "$p" || die "port $p (node $1) is already in use: another Kafka, or pick another --base-port"
  done
}

# Starts node i's JVM in its own session (a test runner that kills its
# process group does not take the broker along) and records the pid.
# Appends to kafka.out and remembers where this run's lines begin.
launch_node() {
  local i=$1 nd cds
  nd=$(node_dir "$i")
  require_ports_free "$i"
  touch "$nd/kafka.out"
  wc -l <"$nd/kafka.out" >"$nd/kafka.out.mark"
  # One dumping broker is enough; the dump costs it about 2 s at exit.
  cds=$(cds_opts broker $((1 - BROKER_DUMPING)))
  [[ $cds == *ArchiveClassesAtExit* ]] && BROKER_DUMPING=1
  # shellcheck disable=SC2086 # lists of flags
  (exec setsid java $HEAP_OPTS $BROKER_JVM_OPTS $cds \
    -Dlog4j2.configurationFile="$HERE/log4j2-broker.xml" \
    -Dkafka.logs.dir="$nd/logs" -cp "$LIBS/*" \
    kafka.Kafka "$nd/server.properties" >>"$nd/kafka.out" 2>&1 </dev/null 8>&- 9>&-) &
  echo $! >"$nd/kafka.pid"
  LAUNCHED+=("$i")
}

# How many brokers node i's metadata lists; empty when it does not answer.
# kcat when installed (no JVM start), else Kafka's BrokerApiVersionsCommand.
metadata_brokers() {
  local port
  port=$(broker_port "$1")
  if command -v kcat >/dev/null; then
    timeout 5 kcat -L -b "127.0.0.1:$port" -m 3 2>/dev/null | sed -n 's/^ \([0-9]*\) brokers:$/\1/p'
  else
    tool_java org.apache.kafka.tools.BrokerApiVersionsCommand --bootstrap-server "127.0.0.1:$port" 2>/dev/null |
      grep -c '^127\.0\.0\.1:[0-9]* (id: ' || true
  fi
}

# The lines node i logged since its last launch.
since_launch() {
  local nd
  nd=$(node_dir "$1")
  tail -n +$(($(cat "$nd/kafka.out.mark" 2>/dev/null || echo 0) + 1)) "$nd/kafka.out"
}

node_started() { grep -q 'Kafka Server started' <(since_launch "$1"); }

# Ready means, for every node given: its JVM is alive, it logged "Kafka
# Server started", its broker port accepts connections, and its metadata
# lists every running node as an unfenced broker. Fails fast if a JVM dies.
wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT)) want i pending nd
  while :; do
    want=$(running_count)
    pending=''
    for i in "$@"; do
      nd=$(node_dir "$i")
      if [ -z "$(node_pid "$i")" ]; then
        say "node $i exited while starting; last lines of $nd/kafka.out:"
        tail -n 40 "$nd/kafka.out" >&2
        return 1
      fi
      if ! node_started "$i" || ! port_open "$(broker_port "$i")" || [ "$(metadata_brokers "$i")" != "$want" ]; then
        pending+=" $i"
      fi
    done
    [ -z "$pending" ] && return 0
    if ((SECONDS >= deadline)); then
      say "node(s)$pending not ready after ${START_TIMEOUT}s (want $want brokers in metadata)"
      for i in $pending; do
        say "last lines of $(node_dir "$i")/kafka.out:"
        tail -n 40 "$(node_dir "$i")/kafka.out" >&2
      done
      return 1
    fi
    sleep 0.5
  done
}

# Sends SIG to the given nodes and waits up to T seconds for them to exit.
# Prints the nodes still alive.
signal_nodes() {
  local sig=$1 t=$2 i pid left
  shift 2
  for i in "$@"; do
    pid=$(node_pid "$i")
    if [ -n "$pid" ]; then kill -s "$sig" "$pid" 2>/dev/null || true; fi
  done
  local deadline=$((SECONDS + t))
  while :; do
    left=''
    for i in "$@"; do [ -n "$(node_pid "$i")" ] && left+=" $i"; done
    if [ -z "$left" ] || ((SECONDS >= deadline)); then
      echo "$left"
      return
    fi
    sleep 0.2
  done
}

# SIGTERM, then wait up to STOP_TIMEOUT. When every node stops at once, the
# last ones lose the Raft majority: the Raft leader then waits 5 s for a
# successor that never comes, and a node whose controlled shutdown was not
# committed in time waits for it forever. So once fewer than a majority of
# the nodes run, a node whose broker side has shut down (logs flushed and
# closed) is SIGKILLed at once, and any other after QUORUM_GRACE seconds.
# Kafka writes through the page cache, so that SIGKILL loses nothing a test
# could read back; the next start recovers the log.
stop_nodes() {
  local i pid left lost_at='' deadline=$((SECONDS + STOP_TIMEOUT))
  for i in "$@"; do
    pid=$(node_pid "$i")
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  while :; do
    left=''
    for i in "$@"; do [ -n "$(node_pid "$i")" ] && left+=" $i"; done
    [ -z "$left" ] && break
    if ((C_NODES > 1)) && (($(running_count) * 2 <= C_NODES)); then
      lost_at=${lost_at:-$SECONDS}
      for i in $left; do
        if grep -q "\[BrokerServer id=$i\] shut down completed" <(since_launch "$i"); then
          pid=$(node_pid "$i")
          if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
        fi
      done
    fi
    if [ -n "$lost_at" ] && ((SECONDS - lost_at >= QUORUM_GRACE)); then
      say "node(s)$left lost the controller quorum while stopping: SIGKILL"
      break
    fi
    if ((SECONDS >= deadline)); then
      say "node(s)$left still running ${STOP_TIMEOUT}s after SIGTERM: SIGKILL"
      break
    fi
    sleep 0.2
  done
  if [ -n "$left" ]; then
    # shellcheck disable=SC2086 # word-split the node list
    left=$(signal_nodes KILL 10 $left)
    [ -z "$left" ] || die "node(s)$left survived SIGKILL"
  fi
  for i in "$@"; do rm -f "$(node_dir "$i")/kafka.pid"; done
}

running_count() {
  local n c=0
  for ((n = 1; n <= C_NODES; n++)); do [ -n "$(node_pid "$n")" ] && c=$((c + 1)); done
  echo $c
}

# On a failed or interrupted start, the nodes this run launched are killed:
# a half-started cluster is never left behind.
LAUNCHED=()
undo_launch() {
  local rc=$?
  trap - EXIT INT TERM
  if [ ${#LAUNCHED[@]} -gt 0 ]; then
    say "start failed: stopping node(s) ${LAUNCHED[*]}"
    signal_nodes KILL 10 "${LAUNCHED[@]}" >/dev/null
    for i in "${LAUNCHED[@]}"; do rm -f "$(node_dir "$i")/kafka.pid"; done
  fi
  exit $((rc == 0 ? 1 : rc))
}

# ---------------------------------------------------------------- commands

cmd_start() {
  local nodes="" base=$DEFAULT_BASE_PORT configs=() i kv t0=$SECONDS secure=0
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:-}; shift 2 ;;
      --base-port) base=${2:-}; shift 2 ;;
      --secure) secure=1; shift ;;
      --config) configs+=("${2:-}"); shift 2 ;;
      *) die "start: unknown argument '$1' (see kafka.sh help)" ;;
    esac
  done
  [[ $nodes =~ ^[13]$ ]] || die "start: --nodes must be 1 or 3, got '${nodes}'"
  [[ $base =~ ^[0-9]+$ ]] && ((base >= 1024 && base + MTLS_OFFSET + 2 <= 65535)) ||
    die "start: --base-port $base leaves no room for ports $base..$((base + MTLS_OFFSET + 2)); use 1024..$((65535 - MTLS_OFFSET - 2))"
  for kv in "${configs[@]}"; do [[ $kv == *=* ]] || die "start: --config wants KEY=VALUE, got '$kv'"; done
  command -v java >/dev/null || die "java not found: install openjdk-17-jre-headless"
  need_libs
  lock_dir
  reuse_or_layout "$nodes" "$base" "$secure"
  for ((i = 1; i <= C_NODES; i++)); do
    [ -z "$(node_pid "$i")" ] || die "node $i is already running (pid $(node_pid "$i")); kafka.sh stop --dir $DIR first"
  done
  for ((i = 1; i <= C_NODES; i++)); do require_ports_free "$i"; done
  write_cluster_env
  [ "$C_SECURE" = 1 ] && make_tls
  for ((i = 1; i <= C_NODES; i++)); do write_props "$i" "${configs[@]}"; done
  format_nodes || die "could not format storage in $DIR"
  cds_adopt broker
  trap undo_launch EXIT INT TERM
  for ((i = 1; i <= C_NODES; i++)); do launch_node "$i"; done
  wait_ready $(seq 1 "$C_NODES") || exit 1
  trap - EXIT INT TERM
  say "$C_NODES-node Kafka $KAFKA_VERSION ready in $((SECONDS - t0))s, data in $DIR"
  bootstrap
}

# A directory that already holds a cluster is started again as it is, with
# its data; one laid out for another shape is refused rather than mixed. A
# new layout is only planned here; write_cluster_env records it once the
# ports are known to be free.
reuse_or_layout() {
  local nodes=$1 base=$2 secure=$3
  if load_cluster; then
    if [ "$C_NODES" != "$nodes" ] || [ "$C_BASE" != "$base" ] || [ "$C_VERSION" != "$KAFKA_VERSION" ] || [ "$C_SECURE" != "$secure" ]; then
      die "$DIR holds a $C_NODES-node Kafka $C_VERSION cluster on base port $C_BASE (secure=$C_SECURE), not $nodes nodes of $KAFKA_VERSION on $base (secure=$secure): run kafka.sh clean --dir $DIR or pick another --dir"
    fi
    say "restarting the existing cluster in $DIR"
    return
  fi
  dir_is_empty || die "$DIR is not empty and holds no cluster.env: pick an empty --dir"
  C_NODES=$nodes C_BASE=$base C_ID=$(new_cluster_id) C_VERSION=$KAFKA_VERSION C_SECURE=$secure
}

write_cluster_env() {
  [ -f "$DIR/cluster.env" ] ||
    printf 'nodes=%s\nbase_port=%s\ncluster_id=%s\nversion=%s\nsecure=%s\n' "$C_NODES" "$C_BASE" "$C_ID" "$C_VERSION" "$C_SECURE" >"$DIR/cluster.env"
}

cmd_stop() {
  local i running=()
  [ $# -eq 0 ] || die "stop: unexpected argument '$1'"
  load_cluster || { say "no cluster in $DIR"; return 0; }
  lock_dir
  for ((i = 1; i <= C_NODES; i++)); do [ -n "$(node_pid "$i")" ] && running+=("$i"); done
  [ ${#running[@]} -gt 0 ] || { say "no node running in $DIR"; return 0; }
  stop_nodes "${running[@]}"
  cds_adopt broker
  say "stopped node(s) ${running[*]}"
}

cmd_status() {
  local i pid up=0
  require_cluster
  for ((i = 1; i <= C_NODES; i++)); do
    pid=$(node_pid "$i")
    if [ -n "$pid" ]; then
      up=$((up + 1))
      echo "node $i running pid $pid broker 127.0.0.1:$(broker_port "$i") controller 127.0.0.1:$(controller_port "$i")"
    else
      echo "node $i stopped broker 127.0.0.1:$(broker_port "$i") controller 127.0.0.1:$(controller_port "$i")"
    fi
  done
  echo "Kafka $C_VERSION, $up of $C_NODES node(s) running, data in $DIR"
  bootstrap
  [ "$up" = "$C_NODES" ]
}

node_arg() {
  [[ ${1:-} =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= C_NODES)) || die "node must be 1..$C_NODES, got '${1:-}'"
}

cmd_kill_node() {
  local pid
  require_cluster
  node_arg "${1:-}"
  lock_dir
  pid=$(node_pid "$1")
  [ -n "$pid" ] || die "node $1 is not running"
  [ -z "$(signal_nodes KILL 10 "$1")" ] || die "node $1 (pid $pid) survived SIGKILL"
  rm -f "$(node_dir "$1")/kafka.pid"
  say "node $1 (pid $pid) killed with SIGKILL"
}

cmd_restart_node() {
  local t0=$SECONDS
  require_cluster
  node_arg "${1:-}"
  need_libs
  lock_dir
  [ -z "$(node_pid "$1")" ] || die "node $1 is running (pid $(node_pid "$1")); kafka.sh kill-node $1 first"
  trap undo_launch EXIT INT TERM
  launch_node "$1"
  wait_ready "$1" || exit 1
  trap - EXIT INT TERM
  say "node $1 ready again in $((SECONDS - t0))s"
  bootstrap
}

cmd_clean() {
  [ $# -eq 0 ] || die "clean: unexpected argument '$1'"
  [ -d "$DIR" ] || return 0
  if [ -f "$DIR/cluster.env" ]; then
    cmd_stop
  elif ! dir_is_empty; then
    die "$DIR holds no cluster.env; not deleting a directory kafka.sh did not lay out"
  fi
  rm -rf "$DIR"
  say "removed $DIR"
}

cmd_topic() {
  local action=${1:-} name='' parts='' rf='' extra=()
  shift || true
  require_cluster
  need_libs
  case $action in
    create)
      name=${1:-}; shift || true
      [ -n "$name" ] && [[ $name != -* ]] || die "topic create: NAME missing"
      while [ $# -gt 0 ]; do
        case $1 in
          --partitions) parts=${2:-}; shift 2 ;;
          --rf | --replication-factor) rf=${2:-}; shift 2 ;;
          --if-not-exists) extra+=(--if-not-exists); shift ;;
          --config) extra+=(--config "${2:-}"); shift 2 ;;
          *) die "topic create: unknown argument '$1'" ;;
        esac
      done
      [[ $parts =~ ^[0-9]+$ ]] && ((parts > 0)) || die "topic create $name: --partitions N (N > 0) is required"
      rf=${rf:-$C_NODES}
      [[ $rf =~ ^[0-9]+$ ]] && ((rf >= 1 && rf <= C_NODES)) || die "topic create $name: --rf $rf, but the cluster has $C_NODES node(s)"
      tool_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" \
        --create --topic "$name" --partitions "$parts" --replication-factor "$rf" "${extra[@]}"
      ;;
    describe) tool_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" --describe ${1:+--topic "$1"} ;;
    list) tool_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" --list ;;
    delete)
      [ -n "${1:-}" ] || die "topic delete: NAME missing"
      tool_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" --delete --topic "$1"
      ;;
    *) die "topic: want create, describe, list or delete, got '$action'" ;;
  esac
}

# Runs a class from the Kafka classpath in the foreground, unbounded (the
# caller bounds it, e.g. --timeout-ms). With bootstrap=1 it adds
# --bootstrap-server of DATA_DIR's cluster unless the arguments carry one.
run_class() {
  local with_bootstrap=$1 class=$2 a
  shift 2
  need_libs
  if [ "$with_bootstrap" = 1 ]; then
    for a in "$@"; do [ "$a" = --bootstrap-server ] && with_bootstrap=0; done
    if [ "$with_bootstrap" = 1 ]; then
      require_cluster
      set -- --bootstrap-server "$(bootstrap)" "$@"
    fi
  fi
  # shellcheck disable=SC2086,SC2046 # lists of flags
  exec java $TOOL_JVM_OPTS $(cds_opts "tool-${class##*.}" 0) -Dlog4j2.configurationFile="$HERE/log4j2-tools.xml" \
    -cp "$LIBS/*" "$class" "$@"
}

main() {
  local cmd=${1:-help} args=()
  shift || true
  # --dir is accepted anywhere on the line, except after run-class CLASS,
  # whose arguments belong to the class.
  case $cmd in
    run-class)
      while [ $# -gt 0 ] && [ "$1" = --dir ]; do DIR=${2:-}; shift 2; done
      args=("$@")
      ;;
    *)
      while [ $# -gt 0 ]; do
        case $1 in
          --dir) DIR=${2:-}; [ -n "$DIR" ] || die "--dir wants a directory"; shift 2 ;;
          *) args+=("$1"); shift ;;
        esac
      done
      ;;
  esac
  mkdir -p "$(dirname "$DIR")"
  DIR=$(cd "$(dirname "$DIR")" && pwd)/$(basename "$DIR")
  set -- "${args[@]}"
  case $cmd in
    fetch) cmd_fetch ;;
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status ;;
    bootstrap) require_cluster; bootstrap ;;
    kill-node) cmd_kill_node "$@" ;;
    restart-node) cmd_restart_node "$@" ;;
    clean) cmd_clean "$@" ;;
    topic) cmd_topic "$@" ;;
    console-consumer) run_class 1 org.apache.kafka.tools.consumer.ConsoleConsumer "$@" ;;
    console-producer) run_class 1 org.apache.kafka.tools.ConsoleProducer "$@" ;;
    run-class)
      [ $# -gt 0 ] || die "run-class: CLASS missing"
      run_class 0 "$@"
      ;;
    help | -h | --help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
