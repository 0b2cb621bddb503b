#!/usr/bin/env bash
# On the GPU machine (device tool, carry .gpu): the CUDA backend on cuda:0.
# kiln_cuda_test; the contract suite on cuda:0 and the conformance suite on
# the GPU devices, each in this process and in device workers; then the
# benchmarks: Kiln's cuda:0 matmul vs cuBLAS in one process (f32, bf16 at
# n = 1024 / 4096), and the BERT-base encoder layer (fp32, B8 S128) on
# cuda:0 vs vulkan:0 (alternating runs) with PyTorch eager as the reference;
# cuda_bandwidth_gemm.sh (norms and GELU vs copy bandwidth and PyTorch, bf16
# GEMMs 4096/8192 plain and with bias + GELU vs cuBLAS(Lt)).
# Prints the key results and ratios; the main logs and JSON under $OUT (at
# most 8 files come back), the rest under /tmp/cuda-logs.
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh"
export KILN_FAULT_WORKER=$stage/bin/kiln_fault_worker
export XDG_CACHE_HOME=/tmp/kiln-cache  # the kernel cache: a second start is warm
logs=/tmp/cuda-logs
mkdir -p "$logs"
summary() { grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$1" | tr '\n' ' '; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 240 "$stage/bin/kiln_cuda_test" > "$out/cuda_test.log" 2>&1
echo "kiln_cuda_test exit $?: $(summary "$out/cuda_test.log")"
grep -E '^cuda:0: ' "$out/cuda_test.log"
for iso in thread process; do
  KILN_TEST_ISOLATION=$iso KILN_CTS_DEVICE=cuda:0 timeout 200 "$stage/bin/kiln_cts_test" \
    > "$logs/cts_cuda_$iso.log" 2>&1
  echo "cts cuda:0 ($iso) exit $?: $(summary "$logs/cts_cuda_$iso.log")"
  KILN_TEST_ISOLATION=$iso KILN_CONFORMANCE_GPU_ONLY=1 timeout 300 \
    "$stage/bin/kiln_conformance_test" > "$out/conformance_$iso.log" 2>&1
  echo "conformance GPU devices ($iso) exit $?: $(summary "$out/conformance_$iso.log")"
  grep -E '^\[ cuda:0 \]' "$out/conformance_$iso.log" | awk '{r+=$5; n+=$8} END {print "  cuda:0: " r " cases ran, " n " not claimed"}'
done
# The first failures of each suite, with context.
for f in "$out/cuda_test.log" "$logs/cts_cuda_thread.log" "$logs/cts_cuda_process.log" \
         "$out/conformance_thread.log" "$out/conformance_process.log"; do
  grep -E -A6 'Failure$|Segmentation|terminate|Aborted' "$f" | head -30 | cut -c1-400
done
timeout 200 "$stage/bin/matmul_vs_cublas" --device cuda:0 --dtypes f32,bf16 --sizes 1024,4096 \
  > "$out/cuda_matmul.json" 2> "$logs/cuda_matmul.log"
echo "matmul_vs_cublas exit $?"
grep -E '^cuda:0 n=' "$logs/cuda_matmul.log"
for i in 1 2 3; do
  for dev in cuda:0 vulkan:0; do
    timeout 120 "$stage/bin/kiln_bench" encoder --device "$dev" --batch 8 --iters 50 --threads 16 \
      --export "/tmp/enc_${dev%%:*}" --report_out "$logs/encoder_report_${dev%%:*}.txt" \
      >> "$out/encoder.json" 2>> "$logs/encoder.log"
  done
done
# The encoder with cuda:0 in this process vs in its device worker (interleaved).
timeout 150 "$stage/bin/kiln_bench" isolation --device cuda:0 --iters 300 --batch 8 --threads 16 \
  2> "$out/isolation_cuda.log" > "$logs/isolation_cuda.json"
grep -E '^isolation' "$out/isolation_cuda.log"
LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_encoder.py" /tmp/enc_cuda \
  >> "$out/encoder.json" 2>> "$logs/encoder.log"
cp "$logs/encoder_report_cuda.txt" "$out/" 2>/dev/null
python3 - "$out/encoder.json" "$out/cuda_matmul.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def p50(pred):
    v = [r["p50_ms"] for r in rows if pred(r)]
    return statistics.median(v) if v else None
cuda = p50(lambda r: r.get("impl") == "kiln" and r.get("device") == "cuda:0")
vk = p50(lambda r: r.get("impl") == "kiln" and r.get("device") == "vulkan:0")
busy = [r.get("device_busy_ms") for r in rows if r.get("device") == "cuda:0"]
torch = [r for r in rows if r.get("impl") != "kiln"]
ratio = f"{vk / cuda:.3f}" if cuda and vk else "n/a"
print(f"encoder B8 S128 fp32: kiln cuda:0 p50 {cuda} ms (device busy {busy[-1] if busy else None} ms), "
      f"kiln vulkan:0 p50 {vk} ms, vulkan/cuda = {ratio}")
for t in torch:
    print("  torch:", json.dumps(t))
try:
    m = json.load(open(sys.argv[2]))
except Exception as e:
    print("no matmul results:", e)
    sys.exit(0)
for r in m["results"]:
    for dt in ("f32", "bf16"):
        e = r.get(dt)
        if e:
            print(f"matmul n={r['n']} {dt}: kiln {e['kiln_ms']:.4f} ms ({e['kiln_tflops']:.1f} TFLOP/s) "
                  f"vs cuBLAS {e['cublas_ms']:.4f} ms ({e['cublas_tflops']:.1f}): ratio {e['ratio']:.3f}, "
                  f"rel err {e['max_rel_err']:.2e}, {e['impl']}")
PY
# What ran where in the cuda:0 encoder (implementations and paths).
grep -E 'implementation: |path: ' "$logs/encoder_report_cuda.txt" | sort | uniq -c | sort -rn | head -24
# Per-kernel device times of one cuda:0 encoder run (CUDA events).
awk '/implementation:/{impl=$2} /duration_micros:/{printf "  %8.1f us  %s\n", $2, impl}' \
  "$logs/encoder_report_cuda.txt" | head -40
source "$here/cuda_bandwidth_gemm.sh"
echo done
