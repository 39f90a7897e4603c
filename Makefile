# Thin wrapper over CMake: `make`, `make demo`, `make test`, `make install`.
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
# The suites wait far more than they compute (on rebalances, session
# timeouts, paced publishers, a link the OS gives up on): test_outbox uses
# 0.9 s of CPU in 96 s, test_fault_embedded 2.9 s in 66 s. So ctest runs
# TEST_JOBS tests at a time, twice the cores; the few that compute take
# two of those slots (PROCESSORS, tests/CMakeLists.txt).
TEST_JOBS ?= $(shell echo $$(( $(JOBS) * 2 )))
CMAKE_FLAGS ?=

.PHONY: all deps build-deps test-deps configure build demo test test-kafka test-fault test-asan test-tsan fuzz bench soak install format-check clean

all: build

# install-deps.sh asks dpkg and runs apt-get only for a package that is
# missing; plain `make` checks only what building needs.
deps:
	@deploy/install-deps.sh

build-deps:
	@deploy/install-deps.sh --build

test-deps:
	@deploy/install-deps.sh --test

# A first configure, or any CMAKE_FLAGS, runs CMake: flags given to an
# existing build directory (CI's -DKEYLANE_WERROR=ON) are applied, never
# ignored because a cache exists.
configure: build-deps
	@if [ ! -f $(BUILD)/CMakeCache.txt ] || [ -n "$(CMAKE_FLAGS)" ]; then \
	  echo cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS); \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS); \
	fi

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/bin/keylane demo

# The single entry point of the tests, in order:
#   1. unit, mock (embedded cluster), pg (a throwaway PostgreSQL), deploy,
#      demo (the README's `make demo`, run as a user runs it), docs (the
#      shell blocks of README.md and docs/*.md) and clients (the Python
#      and Go packages, against the worker);
#   2. the kafka suite: the same worker tests and the interop test on a real
#      single-node Apache Kafka that ctest fixtures start and stop;
#   3. the fault suite on a real 3-node cluster (-V: it prints its figures);
#   4. the sanitizer passes (ASan/UBSan, then TSan), then the fuzzer for a
#      bounded time (after replaying every input it ever found a bug with);
#   5. leftovers: no process of the build directories outlives its test
#      (tests/support/leftovers.sh ends and names any, and the step fails).
# Before them all, the format check: every tracked C file as clang-format-14
# lays it out (tests/format-check.sh; it installs clang-format-14).
# Every step runs even when an earlier one failed, so one run shows every
# failure; the last lines say which steps failed, and the exit status is
# non-zero if any did. Labels are anchored: a test has exactly one. Nothing
# is run twice: a test that fails once has failed.
# A test that skips (exit 77) is reported as skipped, not passed; make test
# requires PostgreSQL (KEYLANE_TEST_REQUIRE): a pg test fails without it.
export KEYLANE_TEST_REQUIRE ?= postgresql
TEST_STEPS = \
  "format|$(MAKE) format-check" \
  "suites unit, mock, pg, sim, deploy, demo, docs, clients|cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS) -L '^(unit|mock|pg|sim|deploy|demo|docs|clients)$$'" \
  "kafka suite|cd $(BUILD) && ctest --output-on-failure -L '^kafka$$'" \
  "fault suite|cd $(BUILD) && ctest --output-on-failure -V -L '^fault$$'" \
  "sanitizers|$(MAKE) test-asan" \
  "thread sanitizer|$(MAKE) test-tsan" \
  "fuzz|$(MAKE) fuzz" \
  "leftovers|tests/support/leftovers.sh $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) build-fuzz"

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

# ASan and UBSan over every suite that needs no real broker: unit, mock
# (the worker, lanes, gateway, exec handler on the embedded cluster) and pg
# (the PostgreSQL store), in parallel as the plain run does: each test has
# its own embedded cluster, server and ports (TEST_JOBS at a time, as
# there: they wait far more than they compute).
test-asan: test-deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKEYLANE_ASAN=ON -DKEYLANE_UBSAN=ON $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		ctest --output-on-failure -j $(TEST_JOBS) -L '^(unit|mock|pg)$$'

# ThreadSanitizer over the lanes and worker tests that run their workers
# in the test process (the ones that start keylane processes are left out).
# librdkafka's threads and locks are made visible to it in the test
# programs (tests/support/tsan/c11threads.c); reports with a librdkafka
# frame are suppressed (tests/support/tsan/suppressions.txt says why).
TSAN_TESTS = test_lanes|test_worker|test_worker_pg
test-tsan: test-deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKEYLANE_TSAN=ON $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(subst |, ,$(TSAN_TESTS))
	cd $(TSAN_BUILD) && TSAN_OPTIONS=suppressions=$(CURDIR)/tests/support/tsan/suppressions.txt:second_deadlock_stack=1 \
		ctest --output-on-failure -j $(JOBS) -R '^($(TSAN_TESTS))$$'

FUZZ_SECONDS ?= 30
fuzz: test-deps
	tests/fuzz/run.sh $(FUZZ_SECONDS)

bench: build
	$(BUILD)/bin/keylane-bench produce

# The simulator (tests/sim/sim.c) on random schedules for SECONDS, LMDB and
# a throwaway PostgreSQL; it stops at the first failure and shrinks it.
SECONDS ?= 600
soak: build
	$(BUILD)/bin/keylane-sim --seconds $(SECONDS)

install: build
	cmake --install $(BUILD)

# clang-format-14 --dry-run -Werror over the C sources (FORMAT_FILES, by
# default every tracked .c and .h): tests/format-check.sh.
format-check:
	tests/format-check.sh $(FORMAT_FILES)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) build-fuzz
