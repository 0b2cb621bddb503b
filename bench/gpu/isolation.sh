#!/usr/bin/env bash
# On the GPU machine (device tool, carry .gpu): device workers in child
# processes on the H200's Vulkan device. The contract suite and the
# conformance suite across the process boundary, the fault-injection tests
# (crash, exit, hang, device lost), and the cost of the boundary
# (kiln_bench isolation: tiny graph and encoder, thread vs process,
# interleaved). Prints the key results; logs under $OUT.
set -u
source "$(dirname "$0")/unpack.sh"
export KILN_FAULT_WORKER=$stage/bin/kiln_fault_worker
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for iso in thread process; do
  KILN_TEST_ISOLATION=$iso KILN_CTS_GPU_ONLY=1 timeout 200 "$stage/bin/kiln_cts_test" \
    > "$out/cts_$iso.log" 2>&1
  echo "cts ($iso) exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$out/cts_$iso.log" | tr '\n' ' ')"
done
KILN_TEST_ISOLATION=process KILN_CONFORMANCE_GPU_ONLY=1 timeout 300 \
  "$stage/bin/kiln_conformance_test" > "$out/conformance_process.log" 2>&1
echo "conformance (process) exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$out/conformance_process.log" | tr '\n' ' ')"
timeout 300 "$stage/bin/kiln_engine_test" \
  --gtest_filter='DeviceIsolation.*:*WorkerFaults*:RuntimeV2.*' > "$out/isolation_tests.log" 2>&1
echo "isolation tests exit $?: $(grep -E '^\[  (PASSED|FAILED) |^\[  FAILED' "$out/isolation_tests.log" | tr '\n' ' ')"
grep -E "runs in device worker" "$out/isolation_tests.log" | head -2
for i in 1 2 3; do
  timeout 200 "$stage/bin/kiln_bench" isolation --device vulkan:0 --iters 1000 --batch 8 \
    --threads 16 2> "$out/isolation_bench_$i.log"
  grep "^isolation" "$out/isolation_bench_$i.log"
done
