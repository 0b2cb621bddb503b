#!/usr/bin/env bash
# Runs every CPU benchmark of this machine and prints one JSON object per line.
# GPU benchmarks run on the GPU machine (bench/gpu/run.sh, see docs/benchmarks.md).
#   bench/run_all.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/bench/engine/kiln_bench"
"$bench" matmul --threads 2
"$bench" compile
"$bench" memory
"$build/bench/engine/kiln_quant_bench"
/usr/bin/python3 bench/encoder_vs_ort.py "$build"
if [[ -x "$build/bench/kiln_load" ]]; then
  "$build/bench/kiln_load"
fi
