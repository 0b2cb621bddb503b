#!/usr/bin/env bash
# On the GPU machine (device tool, carry the bundle folder): issue 8's run
# overhead and f32 attention (branch cuda8b). kiln_cuda_test (copies through
# registered host memory, every attention path against an f64 reference);
# attention_fwd --cases f32 (the tiled SIMT kernel) vs PyTorch SDPA f32 with
# TF32 off; the BERT-base encoder layer fp32 B8 S128 on cuda:0 (device worker,
# the default isolation) alternating with PyTorch eager (torch_encoder.py, the
# same weights), twice; kiln_bench isolation (the same layer with cuda:0 in
# this process vs in its device worker, interleaved); then the conformance
# suite on the GPU devices in both isolations. Logs and JSON under $OUT (at
# most 8 files come back).
#   KILN_GPU_BUNDLE=.gpu-cuda8b bash .gpu-cuda8b/cuda_overhead.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh"  # sets $bundle, $stage, $out
export KILN_FAULT_WORKER=$stage/bin/kiln_fault_worker
export XDG_CACHE_HOME=/tmp/kiln-cache
summary() { grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$1" | tr '\n' ' '; }
failures() { grep -E -A8 'Failure$|Segmentation|terminate|Aborted' "$1" | head -40 | cut -c1-300; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
uptime
timeout 180 "$stage/bin/kiln_cuda_test" > "$out/cuda_test.log" 2>&1
echo "kiln_cuda_test exit $?: $(summary "$out/cuda_test.log")"
grep -E 'max \|error\|' "$out/cuda_test.log"
failures "$out/cuda_test.log"
bench=$out/bench.json
timeout 120 "$stage/bin/attention_fwd" --cases f32 --rounds 7 >> "$bench" 2>> "$out/bench.log"
echo "attention_fwd exit $?"
LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_attention.py" --cases f32 --rounds 7 \
  >> "$bench" 2>> "$out/bench.log"
echo "torch_attention exit $?"
# A baseline build (kiln_bench and its device worker from another commit, in
# $bundle/base.tar.xz, optional) runs the same benchmarks in the same call.
base=""
if [[ -f $bundle/base.tar.xz ]]; then
  base=/tmp/kiln-base && mkdir -p $base && tar -xJf "$bundle/base.tar.xz" -C $base
fi
for i in 1 2; do
  exp=(); [[ $i == 1 ]] && exp=(--export /tmp/enc_cuda)
  if [[ -n $base ]]; then
    timeout 120 "$base/kiln_bench" encoder --device cuda:0 --batch 8 --iters 60 --threads 16 \
      2>> "$out/bench.log" | sed 's/"impl":"kiln"/"impl":"kiln-base"/' >> "$bench"
    echo "base encoder exit $?"
  fi
  timeout 120 "$stage/bin/kiln_bench" encoder --device cuda:0 --batch 8 --iters 60 --threads 16 \
    "${exp[@]}" --report_out "$out/encoder_report.txt" >> "$bench" 2>> "$out/bench.log"
  echo "kiln encoder exit $?"
  LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_encoder.py" /tmp/enc_cuda >> "$bench" \
    2>> "$out/bench.log"
  echo "torch encoder exit $?"
done
timeout 150 "$stage/bin/kiln_bench" isolation --device cuda:0 --iters 400 --batch 8 --threads 16 \
  >> "$bench" 2>> "$out/bench.log"
echo "isolation exit $?"
if [[ -n $base ]]; then
  timeout 150 "$base/kiln_bench" isolation --device cuda:0 --iters 400 --batch 8 --threads 16 \
    2>> "$out/bench.log" \
    | sed 's/"bench":"device_isolation_cost"/"bench":"device_isolation_cost","build":"base"/' \
    >> "$bench"
  echo "base isolation exit $?"
fi
tail -5 "$out/bench.log"
python3 - "$bench" <<'PY'
import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{") or line.startswith("["):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
att = [r for r in rows if isinstance(r, dict) and r.get("bench") == "attention_fwd"]
peer = {r["case"]: r for r in att if r["impl"] != "kiln"}
for r in att:
    if r["impl"] != "kiln":
        continue
    t = peer.get(r["case"])
    print(f"attention {r['case']}: kiln {r['implementation']} {r['ms']*1000:.1f} us "
          f"{r['tflops']:.2f} TFLOP/s max err {r['max_abs_err']:.2e}"
          + (f" | SDPA f32 {t['ms']*1000:.1f} us | kiln/SDPA time {r['ms']/t['ms']:.3f}" if t else ""))
enc = [r for r in rows if isinstance(r, dict) and
       (r.get("bench") == "encoder_layer_fp32" or r.get("impl") == "pytorch-eager-cuda")]
for r in enc:
    print("encoder:", json.dumps(r))
kiln = [r["p50_ms"] for r in enc if r.get("impl") == "kiln"]
kbase = [r["p50_ms"] for r in enc if r.get("impl") == "kiln-base"]
eager = [r["p50_ms"] for r in enc if r.get("impl") == "pytorch-eager-cuda"]
if kiln and eager:
    k, e = statistics.median(kiln), statistics.median(eager)
    print(f"encoder B8 S128 fp32: kiln cuda:0 p50 {k:.3f} ms (runs {kiln}), torch eager {e:.3f} ms "
          f"(runs {eager}): ratio {k / e:.3f}")
    if kbase:
        b = statistics.median(kbase)
        print(f"  baseline build p50 {b:.3f} ms (runs {kbase}): ratio to eager {b / e:.3f}, "
              f"this build / baseline {k / b:.3f}")
for r in rows:
    if isinstance(r, dict) and r.get("bench") == "device_isolation_cost":
        print("isolation:", json.dumps(r))
PY
awk '/implementation:/{impl=$2} /duration_micros:/{printf "  %8.1f us  %s\n", $2, impl}' \
  "$out/encoder_report.txt" | head -20
for iso in thread process; do
  KILN_TEST_ISOLATION=$iso KILN_CONFORMANCE_GPU_ONLY=1 timeout 200 \
    "$stage/bin/kiln_conformance_test" > "$out/conformance_$iso.log" 2>&1
  echo "conformance GPU devices ($iso) exit $?: $(summary "$out/conformance_$iso.log")"
  grep -E '^\[ cuda:0 \]' "$out/conformance_$iso.log" | awk '{r+=$5; n+=$8} END {print "  cuda:0: " r " cases ran, " n " not claimed"}'
  failures "$out/conformance_$iso.log"
done
echo done
