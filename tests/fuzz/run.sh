#!/bin/sh
# Builds the envelope fuzzer (libFuzzer + ASan + UBSan) into build-fuzz/,
# seeds it, runs it for SECONDS and fails on any crash, leak, timeout or OOM.
#
# Usage: tests/fuzz/run.sh [SECONDS] [libFuzzer flags...]
#   e.g. tests/fuzz/run.sh 3600 -fork=4
# The corpus it grows stays in build-fuzz/corpus for the next run; findings go
# to build-fuzz/artifacts/ (reproduce: build-fuzz/fuzz_envelope FILE).
set -eu

seconds=${1:-30}
[ $# -gt 0 ] && shift
root=$(CDPATH='' cd -- "$(dirname -- "$0")/../.." && pwd)
out="$root/build-fuzz"

cc=${FUZZ_CC:-}
for c in clang-14 clang; do
  [ -z "$cc" ] && command -v "$c" >/dev/null 2>&1 && cc=$c
done
if [ -z "$cc" ]; then
  echo "run.sh: libFuzzer needs clang; install it: apt-get install clang-14" >&2
  exit 2
fi

mkdir -p "$out/corpus" "$out/seeds" "$out/artifacts"
msgpack=$(pkg-config --cflags --libs msgpack)
flags="-std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -g -O1
  -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter
  -I$root/include -I$root"
lib="$root/broker/envelope.c $root/broker/uuid.c $root/common/error.c
  $root/common/clock.c"

# shellcheck disable=SC2086 # word splitting of the flag lists is intended
$cc $flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  $lib "$root/tests/fuzz/fuzz_envelope.c" $msgpack -o "$out/fuzz_envelope"
# shellcheck disable=SC2086
$cc $flags $lib "$root/tests/fuzz/make_corpus.c" $msgpack \
  -o "$out/make_corpus"
"$out/make_corpus" "$out/seeds"

# The envelope's field names and format bytes, so mutations speak msgpack.
cat >"$out/envelope.dict" <<'EOF'
"\xa1v"
"\xa2id"
"\xa1t"
"\xa2ts"
"\xa1p"
"\xa1h"
"\x85"
"\x86"
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

log="$out/fuzz.log"
rc=0
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  "$out/fuzz_envelope" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 -dict="$out/envelope.dict" \
  -artifact_prefix="$out/artifacts/" "$@" "$out/corpus" "$out/seeds" \
  >"$log" 2>&1 || rc=$?

grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec)|Done [0-9]+ runs' "$log" || true
if [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|SUMMARY: ' "$log"; then
  echo "run.sh: the fuzzer found a problem (exit $rc); see $log and $out/artifacts/" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
echo "run.sh: no findings in ${seconds}s; corpus: $(ls "$out/corpus" | wc -l) units"

# The exec handler's answer parser and request builder, as long again.
mkdir -p "$out/corpus_exec_answer" "$out/seeds_exec_answer"
jansson=$(pkg-config --cflags --libs jansson)
# shellcheck disable=SC2086
$cc $flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  "$root/worker/handler_exec_line.c" "$root/common/json_msgpack.c" \
  "$root/common/error.c" "$root/tests/fuzz/fuzz_exec_answer.c" $jansson \
  $msgpack -lm -o "$out/fuzz_exec_answer"
printf '{"seq":1,"status":"ok"}' >"$out/seeds_exec_answer/ok"
printf '{"status":"fail","error":{"code":7}}' >"$out/seeds_exec_answer/fail"
rc=0
"$out/fuzz_exec_answer" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$out/artifacts/" \
  "$@" "$out/corpus_exec_answer" "$out/seeds_exec_answer" \
  >"$out/fuzz_exec_answer.log" 2>&1 || rc=$?
grep -E '^stat::(number_of_executed_units|average_exec_per_sec)|^#[0-9]+[[:space:]]+DONE' "$out/fuzz_exec_answer.log" || true
if [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|SUMMARY: ' "$out/fuzz_exec_answer.log"; then
  echo "run.sh: fuzz_exec_answer found a problem (exit $rc); see $out/fuzz_exec_answer.log" >&2
  tail -n 40 "$out/fuzz_exec_answer.log" >&2
  exit 1
fi
echo "run.sh: fuzz_exec_answer: no findings in ${seconds}s"
