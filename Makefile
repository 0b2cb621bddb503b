# The two commands of the README. Both install what is missing first.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
KILND_FLAGS ?=
# RELEASE_UNITY=ON configures a new $(BUILD_DIR) as a unity build (batches of
# UNITY_BATCH sources, as the ASan build): the same targets and flags, less
# cold compile time (docs/development.md has the figures). .ci/run sets it (CI
# starts with an empty ccache); developers' default stays one file at a time
# (incremental rebuilds are cheaper, and a compile error names its own file).
RELEASE_UNITY ?= OFF
# Sanitizer builds (docs/development.md, "Sanitizers and fuzzing"): clang, their
# own build directories, only the targets their suites need.
ASAN_DIR ?= build-asan
TSAN_DIR ?= build-tsan
FUZZ_SECONDS ?= 20
SAN_CMAKE = -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  -DKILN_WITH_VULKAN=OFF -DKILN_WITH_CUDA=OFF -DKILN_BUILD_BENCH=OFF \
  -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld \
  -DCMAKE_MODULE_LINKER_FLAGS=-fuse-ld=lld
# The ASan build compiles each target as unity batches of UNITY_BATCH sources
# (CMake's UNITY_BUILD): the protobuf, gRPC, gtest and Abseil headers and their
# instrumented inline code are compiled once per batch instead of once per file.
# docs/development.md ("Sanitizers and fuzzing") has the compile-time figures.
UNITY_BATCH ?= 8
ASAN_CMAKE = -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=$(UNITY_BATCH)
# The base, IR, engine, ONNX importer, e2e, device-contract, server and client
# suites under ASan + UBSan (kilnd, kilnctl and the device worker they start are
# sanitized too); .ci/run runs it after `make test`. Not here, for CI time
# (docs/development.md has the budget): the conformance suite (it compiles under
# clang now), the ONNX node tests; not at all: GPU tests and the Python package
# install test (pip, not our code).
ASAN_TARGETS = kiln_base_test kiln_ir_test kiln_engine_test kiln_e2e_test kiln_cts_test \
  kiln_onnx_test kiln_server_test kiln_npy_test kiln_report_format_test kiln_client_test \
  kiln_server_concurrency_test kilnd kilnctl kiln_fuzz_all
ASAN_CTEST = -LE 'gpu|fuzz' -R '^(kiln_base_test|kiln_ir_test|kiln_engine_test|kiln_e2e_test|kiln_cts_test|kiln_onnx_test|kiln_server_test|kiln_npy_test|kiln_report_format_test|kiln_client_test|kiln_python_client_test|kiln_server_concurrency_test)'
# Symbolized reports; any report fails the process. LeakSanitizer is on: the
# leaks of uninstrumented libraries are suppressed by name in tests/fuzz/lsan.supp.
export ASAN_OPTIONS ?= abort_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS ?= suppressions=$(CURDIR)/tests/fuzz/lsan.supp:print_suppressions=0

.PHONY: deps configure build test run bench clean format lint \
  configure-asan test-asan fuzz configure-tsan test-tsan

deps:
	./scripts/install-deps.sh

configure: deps
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	    $(if $(filter ON,$(RELEASE_UNITY)),$(ASAN_CMAKE)); fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -LE gpu -j $(JOBS)

# ASan + UBSan build of the suites and the fuzz targets (one clang build:
# KILN_FUZZ instruments it for libFuzzer too), then the suites, every fuzz
# corpus replayed, and each fuzz target for FUZZ_SECONDS. .ci/run calls it.
configure-asan: deps
	@if [ ! -f $(ASAN_DIR)/build.ninja ]; then \
	  cmake -S . -B $(ASAN_DIR) $(SAN_CMAKE) $(ASAN_CMAKE) -DKILN_SANITIZE=ON -DKILN_FUZZ=ON \
	    -DKILN_FUZZ_SECONDS=$(FUZZ_SECONDS); fi

test-asan: configure-asan
	cmake -S . -B $(ASAN_DIR) -DKILN_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	cmake --build $(ASAN_DIR) -j $(JOBS) --target $(ASAN_TARGETS) \
	  $$(cmake --build $(ASAN_DIR) --target help | grep -oE '^(kiln_python|kiln-device-worker):' | tr -d :)
	ctest --test-dir $(ASAN_DIR) --output-on-failure $(ASAN_CTEST) -j $(JOBS)
	ctest --test-dir $(ASAN_DIR) --output-on-failure -L fuzz -j $(JOBS)

# Only the fuzz targets (corpus replay + FUZZ_SECONDS each).
fuzz: configure-asan
	cmake -S . -B $(ASAN_DIR) -DKILN_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	cmake --build $(ASAN_DIR) -j $(JOBS) --target kiln_fuzz_all
	ctest --test-dir $(ASAN_DIR) --output-on-failure -L fuzz -j $(JOBS)

# ThreadSanitizer build of the schedulers' tests (FairScheduler, kilnd's
# WorkPool) and of kilnd's shared state (tenants, report store, metrics, shared
# memory registry) with the absl::Mutex annotations (tests/tsan/), then kilnd's
# sessions, dynamic batcher and stateful sessions over a real CPU engine
# (kiln_tsan_server_test; OMP_NUM_THREADS=1 keeps kernels off OpenMP's
# uninstrumented threads). A unity build, as the ASan one; not in CI.
# docs/development.md says what TSan can and cannot check here and why.
configure-tsan: deps
	@if [ ! -f $(TSAN_DIR)/build.ninja ]; then \
	  cmake -S . -B $(TSAN_DIR) $(SAN_CMAKE) $(ASAN_CMAKE) -DKILN_TSAN=ON; fi

test-tsan: configure-tsan
	cmake --build $(TSAN_DIR) -j $(JOBS) --target kiln_tsan_test kiln_tsan_server_test
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  $(TSAN_DIR)/tests/kiln_tsan_test
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" OMP_NUM_THREADS=1 \
	  $(TSAN_DIR)/tests/kiln_tsan_server_test

run: build
	$(BUILD_DIR)/server/kilnd $(KILND_FLAGS)

bench: build
	./bench/run_all.sh $(BUILD_DIR)

format:
	./scripts/format.sh

lint: build
	./scripts/lint.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR)
