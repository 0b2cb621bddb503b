#!/usr/bin/env bash
# Installs the Debian 12 packages Kiln builds, tests and benchmarks with, but only
# the ones that are missing, so a warm machine pays nothing. Called first by
# `make run` and `make test`; safe to run by hand.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build ccache pkg-config git
  # wire, logging, metrics
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev libfmt-dev prometheus-cpp-dev libssl-dev libxxhash-dev
  nlohmann-json3-dev libcli11-dev
  # weight files: .npz archives (engine/io/npz.h)
  libzip-dev
  # CPU backend
  libdnnl-dev
  # Vulkan backend (lavapipe runs it on the CPU)
  libvulkan-dev glslc spirv-tools libshaderc-dev mesa-vulkan-drivers vulkan-tools
  # tests and benchmarks (valgrind: the Vulkan stream memcheck test; stress:
  # loading the cores in flakiness runs)
  libgtest-dev libgmock-dev libbenchmark-dev valgrind stress
  # sanitizer and fuzz builds (make test-asan, make fuzz, make test-tsan): clang 14
  # with its sanitizer runtimes and libFuzzer, its OpenMP, llvm-symbolizer for reports,
  # lld (links the instrumented binaries faster than GNU ld)
  clang libclang-rt-14-dev libomp-dev llvm-14 lld
  # Python client and numerics references
  python3 python3-grpcio python3-protobuf python3-numpy python3-venv python3-pip
  python3-torch python3-onnx libopenblas0-pthread
  # ONNX import: the schema (onnx/onnx-ml.pb.h, libonnx_proto) and the backend node tests
  libonnx-dev libonnx-testdata
  # training: kilnctl train --data fashion-mnist (and its test) reads the gzip IDX files
  dataset-fashion-mnist zlib1g-dev
  # metrics scrape test
  curl
  # deploy tests (tests/deploy): compose files validated by docker-compose 1.29,
  # Prometheus and promtool against a real kilnd, nginx as the gRPC balancer
  docker-compose prometheus nginx python3-yaml
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# Node.js may come from outside Debian (its own npm included); the Debian npm
# package conflicts with such an install, so ask for it only when npm is absent.
if ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages present"
fi
