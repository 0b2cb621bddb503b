#!/usr/bin/env bash
# On the GPU machine (device tool, carry the bundle folder; issue 8's CUDA
# graphs and attention): kiln_cuda_test (the attention paths against an f64
# reference, graph capture and replay on a stream, the engine's CUDA-graph
# test in this process and in a device worker), attention_fwd vs PyTorch SDPA
# (bf16, the issue's cases and two decode cases), the BERT-base encoder layer
# fp32 B8 S128 on cuda:0 with --cuda_graphs off / on (alternating) vs PyTorch
# eager, then the contract and conformance suites on cuda:0 in both
# isolation modes. Prints the ratios; logs and JSON under $OUT.
#   KILN_GPU_BUNDLE=.gpu-cuda8 bash .gpu-cuda8/cuda_graphs_attention.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh"
export KILN_FAULT_WORKER=$stage/bin/kiln_fault_worker
export XDG_CACHE_HOME=/tmp/kiln-cache
logs=/tmp/cuda-logs
mkdir -p "$logs"
summary() { grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$1" | tr '\n' ' '; }
failures() { grep -E -A8 'Failure$|Segmentation|terminate|Aborted' "$1" | head -40 | cut -c1-300; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 150 "$stage/bin/kiln_cuda_test" > "$out/cuda_test.log" 2>&1
echo "kiln_cuda_test exit $?: $(summary "$out/cuda_test.log")"
grep -E 'max \|error\||^cuda:0: ' "$out/cuda_test.log"
failures "$out/cuda_test.log"
timeout 150 "$stage/bin/attention_fwd" --rounds 5 > "$out/attention.json" 2> "$logs/attention.log"
echo "attention_fwd exit $?"; tail -3 "$logs/attention.log"
LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_attention.py" --rounds 5 >> "$out/attention.json" 2>> "$logs/attention.log"
echo "torch_attention exit $?"
for i in 1 2; do
  for g in off on; do
    exp=(); [[ $i == 1 && $g == off ]] && exp=(--export /tmp/enc_cuda)
    timeout 120 "$stage/bin/kiln_bench" encoder --device cuda:0 --batch 8 --iters 60 --threads 16 \
      --cuda_graphs "$g" "${exp[@]}" --report_out "$logs/encoder_report_$g.txt" \
      >> "$out/encoder.json" 2>> "$logs/encoder.log"
  done
done
LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_encoder.py" /tmp/enc_cuda \
  >> "$out/encoder.json" 2>> "$logs/encoder.log"
tail -3 "$logs/encoder.log"
python3 - "$out/attention.json" "$out/encoder.json" <<'PY'
import json, statistics, sys
att = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
torch = {r["case"]: r for r in att if r["impl"] != "kiln"}
for r in att:
    if r["impl"] != "kiln":
        continue
    t = torch.get(r["case"])
    extra = f", KV {r['kv_gbps']:.0f} GB/s" if "kv_gbps" in r else ""
    peer = (f" | SDPA {t['ms']:.4f} ms {t['tflops']:.1f} TFLOP/s"
            + (f", KV {t['kv_gbps']:.0f} GB/s" if "kv_gbps" in t else "")
            + f" | kiln/SDPA speed {t['ms'] / r['ms']:.3f}") if t else ""
    print(f"attention {r['case']}: kiln {r['implementation']} {r['ms']:.4f} ms "
          f"{r['tflops']:.1f} TFLOP/s{extra}, max err {r['max_abs_err']:.2e}{peer}")
enc = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
def p50(g):
    v = [r["p50_ms"] for r in enc if r.get("impl") == "kiln" and r.get("cuda_graphs") == g]
    return (statistics.median(v), v) if v else (None, v)
off, offs = p50("off")
on, ons = p50("on")
busy = {g: [r["device_busy_ms"] for r in enc if r.get("cuda_graphs") == g] for g in ("off", "on")}
states = {g: sorted({r.get("cuda_graph") for r in enc if r.get("cuda_graphs") == g}) for g in ("off", "on")}
eager = [r for r in enc if r.get("impl") != "kiln"]
print(f"encoder B8 S128 fp32 cuda:0: graphs off p50 {off} ms {offs} busy {busy['off']} {states['off']}; "
      f"graphs on p50 {on} ms {ons} busy {busy['on']} {states['on']}")
for t in eager:
    print("  torch:", json.dumps(t))
    ms = t.get("eager_ms") or t.get("p50_ms")
    if ms and on and off:
        print(f"  ratio to eager: graphs on {on / ms:.3f}, off {off / ms:.3f}")
PY
awk '/implementation:/{impl=$2} /duration_micros:/{printf "  %8.1f us  %s\n", $2, impl}' \
  "$logs/encoder_report_on.txt" | head -30
grep -E 'cuda_graph|run_micros' "$logs/encoder_report_on.txt" | head -3
for iso in thread process; do
  KILN_TEST_ISOLATION=$iso KILN_CTS_DEVICE=cuda:0 timeout 60 "$stage/bin/kiln_cts_test" \
    > "$logs/cts_cuda_$iso.log" 2>&1
  echo "cts cuda:0 ($iso) exit $?: $(summary "$logs/cts_cuda_$iso.log")"
  failures "$logs/cts_cuda_$iso.log"
  KILN_TEST_ISOLATION=$iso KILN_CONFORMANCE_GPU_ONLY=1 timeout 90 \
    "$stage/bin/kiln_conformance_test" > "$out/conformance_$iso.log" 2>&1
  echo "conformance GPU devices ($iso) exit $?: $(summary "$out/conformance_$iso.log")"
  grep -E '^\[ cuda:0 \]' "$out/conformance_$iso.log" | awk '{r+=$5; n+=$8} END {print "  cuda:0: " r " cases ran, " n " not claimed"}'
  failures "$out/conformance_$iso.log"
done
echo done
