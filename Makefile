# The two commands of the README. Both install what is missing first.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
KILND_FLAGS ?=

.PHONY: deps configure build test run bench clean format lint

deps:
	./scripts/install-deps.sh

configure: deps
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE); fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -LE gpu -j $(JOBS)

run: build
	$(BUILD_DIR)/server/kilnd $(KILND_FLAGS)

bench: build
	./bench/run_all.sh $(BUILD_DIR)

format:
	./scripts/format.sh

lint: build
	./scripts/lint.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
