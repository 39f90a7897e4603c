#!/bin/sh
# Builds the libFuzzer targets (with ASan and UBSan) into build-fuzz/, with
# CMake (-DKEYLANE_BUILD_FUZZERS=ON, tests/fuzz/CMakeLists.txt), seeds
# them, runs each for SECONDS and fails on any crash, leak, timeout or OOM:
#   envelope      the envelope codec (event/envelope.c)
#   units         the one parser of numbers, durations, sizes (common/units.c),
#                 and the positions and partition lists built on it
#   gateway_body  the gateway's body validation, JSON and msgpack
#   gateway_http  the gateway's request handling, a whole gateway in-process
#   exec_answer   the exec handler's answer lines
#   ids           idempotency keys as the stores keep them (sids, LMDB's
#                 records) and follow-ups' ids
#   worker_api    the queries and keys of the worker's state API
#                 (cli/worker_api.c) and the percent-decoding under them
# Usage: tests/fuzz/run.sh [SECONDS] [libFuzzer flags...]
#   e.g. FUZZ_JOBS=1 tests/fuzz/run.sh 3600 -fork=4
#   FUZZERS="units gateway_body" tests/fuzz/run.sh 60   (a subset)
# FUZZ_JOBS targets (default: one per core) fuzz at once, each for SECONDS.
# Each corpus grows in build-fuzz/corpus-NAME (the envelope's in
# build-fuzz/corpus) for the next run; findings go to build-fuzz/artifacts/
# (reproduce: build-fuzz/bin/fuzz_NAME FILE). Every finding is kept in the
# repository, in tests/fuzz/corpus/NAME/, and replayed before fuzzing.
set -eu

seconds=${1:-30}
[ $# -gt 0 ] && shift
root=$(CDPATH='' cd -- "$(dirname -- "$0")/../.." && pwd)
out="$root/build-fuzz"
fuzzers=${FUZZERS:-envelope units gateway_body gateway_http exec_answer ids worker_api}

cc=${FUZZ_CC:-}
for c in clang-14 clang; do
  [ -z "$cc" ] && command -v "$c" >/dev/null 2>&1 && cc=$c
done
if [ -z "$cc" ]; then
  echo "run.sh: libFuzzer needs clang; install it: apt-get install clang-14" >&2
  exit 2
fi

mkdir -p "$out/seeds" "$out/artifacts"
cmake -S "$root" -B "$out" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE= \
  -DKEYLANE_BUILD_FUZZERS=ON -DKEYLANE_BUILD_TESTS=OFF >"$out/cmake.log" 2>&1 ||
  { cat "$out/cmake.log" >&2; exit 1; }
bin="$out/bin"

# Seeds: the envelope's from make_corpus; the others written here.
seed() {
  dir="$out/seeds-$1"
  mkdir -p "$dir"
  case $1 in
  units)
    i=0
    for s in '\0030' '\00330s' '\001500ms' '\0001M' '\00364KiB' '\0001e3' \
      '\002 5' '\0039223372036854775807' '\0027d' '\000@-15m' \
      '\000@2024-05-01T12:00:00.25Z' '\0000,2,5-7' '\000watermark'; do
      i=$((i + 1))
      printf "$s" >"$dir/s$i"
    done ;;
  worker_api)
    printf 'state=retrying,parked&limit=10&from=3:41' >"$dir/query"
    printf 'limit=1000&state=waiting' >"$dir/limit"
    printf 'p%%6Fison%%33' >"$dir/key"
    printf 'acct%%2F7%%00%%ff' >"$dir/bytes" ;;
  ids)
    printf '\000\000\000\006acct-7order-17' >"$dir/sid"
    printf '\000order-17' >"$dir/unscoped"
    printf '\001acct-7\377order-17' >"$dir/pair"
    printf '\001k\3770190f5c4-7d2a-7b3e-9f00-1234567890ab' >"$dir/uuid"
    printf '\376\000\000\000\007\003\000\001k0123456789abcdef' >"$dir/lmdb5"
    printf '\002~events/3/1042/0' >"$dir/emit"
    printf '\002~t/0/0/63' >"$dir/emit63"
    printf '\002~events/3/1042/0/00c0ffee0000beef' >"$dir/emit-nonce"
    printf '\002~t/0/0/63/ffffffffffffffff' >"$dir/emit63-nonce" ;;
  gateway_body)
    printf '\000{"key":"a","type":"t","payload":{"amount":5,"seq":1}}' >"$dir/one"
    printf '\000[{"key":"a","type":"t","id":"x","headers":{"h":"v"}},{"key":"b","type":"t","payload_b64":"AAE="}]' >"$dir/two"
    printf '\001\x83\xa3key\xa1a\xa4type\xa1t\xa7payload\xc4\x02\x00\x01' >"$dir/mp"
    printf '\001\x91\x82\xa3key\xa1k\xa4type\xa1t' >"$dir/mparr"
    printf '\000[{"key":"a","type":"t","not_before":1767225600000},{"key":"b","type":"t","delay":"15m"}]' >"$dir/delayed"
    printf '\001\x83\xa3key\xa1a\xa4type\xa1t\xaanot_before\xcf\x00\x00\x01\x9b\x76\xda\xa8\x00' >"$dir/mpdelayed"
    printf '\001\x83\xa3key\xa1a\xa4type\xa1t\xa7payload\x81\xa7$base64\xa4AAE=' >"$dir/mpbase64map"
    printf '\001\x83\xa3key\xa1a\xa4type\xa1t\xa7headers\xc4\x02\x00\x01' >"$dir/mpbinheaders" ;;
  gateway_http)
    b='{"key":"a","type":"t"}'
    printf 'POST /v1/topics/events/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
      ${#b} "$b" >"$dir/post"
    printf 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/topics/events/route?key=k%%20x HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nOrigin: https://app.example.com\r\n\r\n' >"$dir/pipelined"
    printf 'POST /v1/topics/events/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/msgpack\r\nExpect: 100-continue\r\n\r\n3\r\n\x81\xa1k\r\n0\r\n\r\n' >"$dir/chunked"
    printf 'POST /v1/topics/x.dlq/events HTTP/1.1\r\nContent-Length : 2\r\nX: a\r\n b\r\nTransfer-Encoding: gzip, chunked\r\n\r\n{}' >"$dir/smuggle"
    # RFC 9112's chunked framing (common/http_chunked.c): extensions,
    # trailers, a body split in chunks, then near misses of each; Host.
    c='POST /v1/topics/events/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n'
    printf "${c}"'a ; n = "q\\" v";m=t\r\n{"key":"a"\r\nc\r\n,"type":"t"}\r\n0;z\r\nX-T: 1\r\n\r\n' >"$dir/chunked-ext"
    printf "${c}"'16 \r\n{"key":"a","type":"t"}\r\n0\r\n\r\n' >"$dir/chunked-ws"
    printf "${c}"'16\r\n{"key":"a","type":"t"}XY0\r\n\r\n' >"$dir/chunked-nocrlf"
    printf "${c}"'16\r\n{"key":"a","type":"t"}\r\n0\r\n\n' >"$dir/chunked-lf"
    printf 'GET /healthz HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n' >"$dir/host" ;;
  exec_answer)
    printf '{"seq":1,"status":"ok"}' >"$dir/ok"
    printf '{"status":"fail","error":{"code":7}}' >"$dir/fail"
    printf '{"seq":2,"status":"ok","emit":[{"topic":"t2","key":"k","type":"t","payload":{"a":[1,2]}},{"key":"k","type":"t","payload_b64":"AAE="}]}' >"$dir/emit"
    printf '{"status":"ok","emit":[{"topic":"x.dlq","key":"k","type":"t","id":"i","headers":{"h":"v"}}]}' >"$dir/emit_refused"
    printf '{"seq":3,"status":"ok","cancel":[{"id":"r-1"},{"id":"r-2","key":"k"}]}' >"$dir/cancel"
    printf '{"status":"ok","cancel":[{"id":7},{"id":"r","key":"other"},{"id":""},"r",{"id":"r","due":1}],"emit":[]}' >"$dir/cancel_refused"
    printf '{"status":"ok","cancel":[]}' >"$dir/cancel_none"
    printf '{"status":"ok","cancel":[{"id":"%s"}]}' "$(printf '%0256d' 0)" >"$dir/cancel_long"
    printf '{"status":"fail","error":"e","cancel":[{"id":"r"}]}' >"$dir/cancel_fail"
    printf '{"seq":5,"status":"ok","cancel":[{"id":"r\\u0000"}],"emit":[{"topic":"t\\u0000","key":"k\\u0000","type":"t","payload":{"n":"\\u0000"}}]}' >"$dir/nul" ;;
  esac
}

build() {
  cmake --build "$out" -j "$(nproc)" --target "$@" >"$out/build.log" 2>&1 ||
    { tail -n 60 "$out/build.log" >&2; exit 1; }
}

cat >"$out/envelope.dict" <<'EOF'
"\xa1v"
"\xa2id"
"\xa1t"
"\xa2ts"
"\xa1p"
"\xa1h"
"\xa2nb"
"\x85"
"\x86"
"\x87"
"\xc4"
"\xc5"
"\xc6"
"\xd9"
"\xda"
"\xdb"
"\xde"
"\xdf"
"\xcf"
"\xd3"
EOF
cat >"$out/gateway_http.dict" <<'EOF'
"HTTP/1.1"
"\x0d\x0a"
"Content-Length:"
"Transfer-Encoding:"
"chunked"
"Content-Type: application/json"
"Content-Type: application/msgpack"
"Origin:"
"Authorization: Bearer "
"Expect: 100-continue"
"POST /v1/topics/events/events "
"GET /v1/topics/events/route?key="
"GET /healthz "
"Connection: close"
"Host: x\x0d\x0a"
"Transfer-Encoding: chunked\x0d\x0a\x0d\x0a"
"\x0d\x0a0\x0d\x0a\x0d\x0a"
";name=value"
";n=\"q\""
" ;"
EOF

# fuzz_one NAME [libFuzzer flags...]: replays the inputs kept for NAME,
# then fuzzes it for SECONDS; says what it did, marks it $out/ran-NAME
# when it ended and $out/failed-NAME when it found a problem.
fuzz_one() {
  f=$1
  shift
  corpus="$out/corpus-$f"
  dict=''
  case $f in
  envelope)
    corpus="$out/corpus"
    "$bin/make_corpus" "$out/seeds"
    seeds="$out/seeds"
    dict="-dict=$out/envelope.dict" ;;
  gateway_http)
    seed "$f"
    seeds="$out/seeds-$f"
    dict="-dict=$out/gateway_http.dict" ;;
  *)
    seed "$f"
    seeds="$out/seeds-$f" ;;
  esac
  mkdir -p "$corpus"
  log="$out/fuzz_$f.log"
  rc=0
  # Every input a fuzzer ever found a problem with is kept in
  # tests/fuzz/corpus/NAME and replayed first, each once: a bug found once
  # fails every run after its fix is undone, not one run in many.
  kept="$root/tests/fuzz/corpus/$f"
  if [ -d "$kept" ] && [ -n "$(ls -A "$kept")" ]; then
    # shellcheck disable=SC2046
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
      "$bin/fuzz_$f" $(find "$kept" -type f | sort) >"$log.kept" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|CHECK failed|SUMMARY: ' "$log.kept"; then
      echo "run.sh: fuzz_$f fails on an input kept in tests/fuzz/corpus/$f (exit $rc); see $log.kept" >&2
      tail -n 40 "$log.kept" >&2
      echo "$f" >"$out/failed-$f"
      : >"$out/ran-$f"
      return
    fi
    echo "run.sh: fuzz_$f: the $(find "$kept" -type f | wc -l) kept inputs pass"
  else
    kept=''
  fi
  # shellcheck disable=SC2086
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$bin/fuzz_$f" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 $dict \
    -artifact_prefix="$out/artifacts/$f-" "$@" "$corpus" "$seeds" $kept \
    >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  if [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|CHECK failed|SUMMARY: ' "$log"; then
    echo "run.sh: fuzz_$f found a problem (exit $rc); see $log and $out/artifacts/;" \
      "keep the input that found it in tests/fuzz/corpus/$f/ with its fix" >&2
    tail -n 40 "$log" >&2
    echo "$f" >"$out/failed-$f"
  else
    echo "run.sh: fuzz_$f: ${execs:-?} execs (${rate:-?}/s), ${cov:-cov: ?} in ${seconds}s; corpus: $(ls "$corpus" | wc -l) units"
  fi
  : >"$out/ran-$f"
}

# Every target built at once, then FUZZ_JOBS lanes (default: one per core)
# each fuzz their share one after another: every libFuzzer run is
# single-threaded, so on 2 cores two run side by side in the time of one.
# A lane's messages are printed when it ends, each lane's together.
targets=make_corpus
for f in $fuzzers; do
  targets="$targets fuzz_$f"
done
# shellcheck disable=SC2086
build $targets
jobs=${FUZZ_JOBS:-$(nproc)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
rm -f "$out"/failed-* "$out"/ran-* "$out"/lane-*.out
lane=0
pids=''
while [ "$lane" -lt "$jobs" ]; do
  (
    nth=0
    for name in $fuzzers; do
      [ $((nth % jobs)) -eq "$lane" ] && fuzz_one "$name" "$@"
      nth=$((nth + 1))
    done
  ) >"$out/lane-$lane.out" 2>&1 &
  pids="$pids $!"
  lane=$((lane + 1))
done
for pid in $pids; do
  wait "$pid" || true
done
cat "$out"/lane-*.out
# A target whose lane stopped before it ended (set -e) failed too.
failed=''
for f in $fuzzers; do
  if [ -f "$out/failed-$f" ] || [ ! -f "$out/ran-$f" ]; then
    failed="$failed $f"
  fi
done
if [ -n "$failed" ]; then
  echo "run.sh: findings in:$failed" >&2
  exit 1
fi
