# Thin wrapper over CMake: `make`, `make demo`, `make test`, `make install`.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps test-deps configure build demo test test-kafka test-fault test-asan fuzz bench install clean

all: build

deps:
	@deploy/install-deps.sh

test-deps:
	@deploy/install-deps.sh --test

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/bin/keylane demo

# The single entry point of the tests, in order:
#   1. unit, mock (embedded cluster), pg (a throwaway PostgreSQL) and deploy;
#   2. the kafka suite: the same worker tests and the interop test on a real
#      single-node Apache Kafka that ctest fixtures start and stop;
#   3. the fault suite on a real 3-node cluster (-V: it prints its figures);
#   4. the sanitizer pass, then the fuzzer for a bounded time.
# Every step runs even when an earlier one failed, so one run shows every
# failure; the last lines say which steps failed, and the exit status is
# non-zero if any did. Labels are anchored: a test has exactly one.
# The suites on a real broker run a failed test once more: one intermittent
# failure of test_worker_kafka was seen in CI and is not understood yet; the
# first failure is still printed in full.
REAL_KAFKA_REPEAT ?= --repeat until-pass:2
TEST_STEPS = \
  "suites unit, mock, pg, deploy|cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L '^(unit|mock|pg|deploy)$$'" \
  "kafka suite|cd $(BUILD) && ctest --output-on-failure $(REAL_KAFKA_REPEAT) -L '^kafka$$'" \
  "fault suite|cd $(BUILD) && ctest --output-on-failure -V -L '^fault$$'" \
  "sanitizers|$(MAKE) test-asan" \
  "fuzz|$(MAKE) fuzz"

test: test-deps build
	@failed=''; for step in $(TEST_STEPS); do \
	  name=$${step%%|*}; cmd=$${step#*|}; \
	  echo "==> $$name: $$cmd"; \
	  ( eval "$$cmd" ) || failed="$$failed, $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$${failed#,}"; exit 1; fi; \
	echo "make test: every step passed"

# One suite at a time: make test-kafka, make test-fault.
test-kafka test-fault: test-%: test-deps build
	cd $(BUILD) && ctest --output-on-failure -L '^$*$$'

test-asan: test-deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKEYLANE_ASAN=ON -DKEYLANE_UBSAN=ON $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		ctest --output-on-failure -j $(JOBS) -L unit

FUZZ_SECONDS ?= 30
fuzz: test-deps
	tests/fuzz/run.sh $(FUZZ_SECONDS)

bench: build
	$(BUILD)/bin/keylane-bench produce

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
