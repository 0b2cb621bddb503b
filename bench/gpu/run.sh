#!/usr/bin/env bash
# On the GPU machine (device tool, carry .gpu): unpacks the bundle made by
# scripts/gpu_bundle.sh and runs the GPU test label and the GPU benchmarks,
# writing JSON and logs under $OUT.
set -u
root=$(pwd)
source "$(dirname "$0")/unpack.sh"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nproc
  echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"
} > "$out/env.txt" 2>&1
# The conformance suite on every device (cpu:0 and the H200 through Vulkan).
KILN_CONFORMANCE_GPU_ONLY=1 timeout 300 "$stage/bin/kiln_conformance_test" \
  --gtest_output=json:"$out/conformance.json" > "$out/conformance.log" 2>&1
echo "conformance exit $?" >> "$out/env.txt"
# The device contract suite on the H200's Vulkan device, and the Vulkan
# backend's own tests (streams, the semaphore churn, bounded waits) there.
KILN_CTS_GPU_ONLY=1 timeout 200 "$stage/bin/kiln_cts_test" \
  --gtest_output=json:"$out/cts.json" > "$out/cts.log" 2>&1
echo "cts exit $?" >> "$out/env.txt"
timeout 300 "$stage/bin/kiln_vulkan_test" --gtest_output=json:"$out/vulkan_test.json" \
  > "$out/vulkan_test.log" 2>&1
echo "vulkan_test exit $?" >> "$out/env.txt"
timeout 200 "$stage/bin/matmul_vs_cublas" --device vulkan:0 > "$out/matmul.json" 2>> "$out/env.txt"
timeout 120 "$stage/bin/kiln_bench" encoder --device vulkan:0 --batch 8 --iters 50 \
  --threads 16 --export /tmp/enc --report_out "$out/encoder_report.txt" > "$out/encoder.json" 2>> "$out/env.txt"
LD_LIBRARY_PATH= timeout 120 python3 "$root/bench/gpu/torch_encoder.py" /tmp/enc >> "$out/encoder.json" 2>> "$out/env.txt"
timeout 300 "$stage/bin/kiln_bench" placement --threads 16 > "$out/placement.json" 2>> "$out/env.txt"
# The encoder with and without building the dispatch report (a report records
# two timestamps per step; Record() no longer submits), alternating.
for i in 1 2 3; do
  for rep in 0 1; do
    timeout 60 "$stage/bin/kiln_bench" encoder --device vulkan:0 --batch 8 --iters 50 \
      --threads 16 --with_report $rep >> "$out/encoder_report_cost.json" 2>> "$out/env.txt"
  done
done
# One shared encoder program per device, 1..8 callers of two tenants, each
# device alone and both together.
timeout 240 "$stage/bin/kiln_bench" shared --devices cpu:0,vulkan:0 --callers 1,2,4,8 \
  --seconds 3 --batch 8 --threads 16 > "$out/shared.json" 2>> "$out/env.txt"
echo done >> "$out/env.txt"
