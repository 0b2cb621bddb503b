#!/usr/bin/env bash
# Issue 8, bert8: where a resident BERT layer's Run spends its time besides the
# kernels, and what the changes cut, against PyTorch eager per call + synchronize, in
# one call. Two layers: BERT fp32 B8 S128 (target <= 0.6x eager) and BERT bf16 B32 S512
# (target <= 0.8x eager), each with x and y resident on the device (layers_bf16 --io
# resident, res8's row (a)). Per layer, layers_bf16 runs in these configurations (one
# process each, p50 of --iters Runs after 3 warm-ups, wall clock):
#   old      main's path: process isolation, a report every run, --inline_run_micros 0
#            (every run handed to the device's scheduler thread) and no spin-then-block
#            waits (KILN_WORKER_REPLY_SPIN_US=0 KILN_WORKER_QUEUE_SPIN_US=0); twice
#   last     process isolation, no report in the timed runs (one after them gives the
#            device busy time), bert8's defaults (Engine::Run inline, the spin-then-block
#            waits and socket polls); "hops_us" splits the Run along its worker round
#            trip; twice
#   nospin_last  as last without the spin-then-block waits and socket polls
#   graphs_on    as last with --cuda_graphs on (the bf16 layer is not launch-bound: auto
#            launches it kernel by kernel); twice
#   thread   the device in this process (no worker), no report in the timed runs
#   every    as last with a report every run (res8's way of timing)
# then torch_layers.py --e2e on the exported weights (eager per call + sync, CUDA events).
# Bundle folder in KILN_GPU_BUNDLE: kiln-gpu.tar.xz (layers_bf16, kiln-device-worker),
# with torch_layers.py beside this script.
set -u
here=$(cd "$(dirname "$0")" && pwd)
bundle=${KILN_GPU_BUNDLE:-.gpu}
stage=/tmp/kiln-gpu-bert8
rm -rf "$stage" && mkdir -p "$stage" && tar -xJf "$bundle/kiln-gpu.tar.xz" -C "$stage"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$stage/lib
out=${OUT:-/tmp/out}
mkdir -p "$out"
bin=$stage/bin
res=$out/bert8.json
: > "$res"
log=$out/bert8.log
: > "$log"
iters=${BERT8_ITERS:-50}
cache=/tmp/bert8_cache  # kernels compile once per layer, in the export run
rm -rf "$cache"
nospin=(env KILN_WORKER_REPLY_SPIN_US=0 KILN_WORKER_QUEUE_SPIN_US=0)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "cores $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg)"
kiln() {  # label, then layers_bf16 arguments
  local label=$1; shift
  timeout 40 "$@" --label "$label" >> "$res" 2>> "$log"
  echo "  $label -> exit $?"
}
summary=$out/bert8_summary.py
cat > "$summary" <<'PY'
import json, sys
rows = []
for line in open(sys.argv[1]):
    if line.startswith("{"):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
name = sys.argv[2]
t = next((r for r in rows if r.get("impl") == f"torch:{name}"), None)
ref = t.get("eager_sync_ms") if t else None
if t:
    print(f"  torch {name}: per call+sync {t.get('eager_sync_ms', float('nan')):.3f} ms, "
          f"CUDA events {t['eager_ms']:.3f} ms, max|y-kiln| {t['max_abs_diff_vs_kiln']:.3g}")
for r in rows:
    impl = r.get("impl", "")
    if r.get("bench") != "layer_bf16" or not impl.endswith(":" + name) or "p50_ms" not in r:
        continue
    ratio = f", {r['p50_ms'] / ref:.2f}x eager per call+sync" if ref else ""
    print(f"  {impl}: Run p50 {r['p50_ms']:.3f} ms, device busy {r['device_busy_ms']:.3f} ms, "
          f"graph {r.get('cuda_graph')}{ratio}")
    if r.get("hops_us"):
        print("    hops (us): " + ", ".join(f"{k} {v:.1f}" for k, v in r["hops_us"].items()))
    if impl.startswith("last:"):
        print("    kernels (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in r["kernels_ms"].items()))
PY
cases=("--dtype f32 --batch 8 --seq 128" "--dtype bf16 --batch 32 --seq 512")
names=(bert_f32 bert_bf16)
for i in 0 1; do
  name=${names[$i]}
  read -r -a c <<< "--layer bert ${cases[$i]}"
  echo "== $name"
  L=("$bin/layers_bf16" "${c[@]}")
  R=("${L[@]}" --io resident --iters "$iters" --cache_dir "$cache")
  kiln "export:$name" "${L[@]}" --iters 3 --export "/tmp/bert8_$name" --cache_dir "$cache"
  kiln "old:$name" "${nospin[@]}" "${R[@]}" --report every --inline_run_micros 0
  kiln "last:$name" "${R[@]}" --report last
  kiln "nospin_last:$name" "${nospin[@]}" "${R[@]}" --report last
  kiln "graphs_on:$name" "${R[@]}" --report last --cuda_graphs on
  kiln "thread:$name" "${R[@]}" --report last --isolation thread
  kiln "every:$name" "${R[@]}" --report every
  kiln "old:$name" "${nospin[@]}" "${R[@]}" --report every --inline_run_micros 0
  kiln "last:$name" "${R[@]}" --report last
  kiln "graphs_on:$name" "${R[@]}" --report last --cuda_graphs on
  LD_LIBRARY_PATH= timeout 60 python3 "$here/torch_layers.py" "/tmp/bert8_$name" --e2e \
    | sed "s/\"impl\": \"torch_eager\"/\"impl\": \"torch:$name\"/" >> "$res" 2>> "$log"
  echo "  torch_layers $name exit $?"
  rm -rf "/tmp/bert8_$name"
  python3 "$summary" "$res" "$name"
done
grep -v '^\s*$' "$log" | grep -iv "warn\|info" | tail -8
