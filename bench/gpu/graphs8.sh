#!/usr/bin/env bash
# Issue 8, graphs8: CUDA graphs' AUTO rule and TF32 on the BERT-base layers, beside
# PyTorch eager in the same call. Both layers with x and y resident on the device
# (layers_bf16 --io resident), p50 of --iters Runs after 3 warm-ups on the wall clock,
# no report in the timed runs (one after them gives the device busy time and kernels):
#   bf16 B32 S512 (target <= 0.8x eager): cuda_graphs auto (twice: AUTO now captures
#     it), on, off (the kernel-by-kernel path AUTO used to take), auto in the bench's
#     own process (thread); each row prints what AUTO weighed (kernels, the cost model's
#     estimate, the launch cost per kernel) and whether the program uses a graph;
#   fp32 B8 S128 (target <= 0.6x eager): auto with TF32 off and on (--allow_tf32 on), twice
#     each, alternating, and both in the bench's own process (thread); PyTorch eager with
#     torch.backends.cuda.matmul.allow_tf32 off and on.
# Bundle folder in KILN_GPU_BUNDLE: kiln-gpu.tar.xz (layers_bf16, kiln-device-worker),
# torch_layers.py beside this script. Full JSON in $OUT/graphs8.json, logs in
# $OUT/graphs8.log.
set -u
here=$(cd "$(dirname "$0")" && pwd)
bundle=${KILN_GPU_BUNDLE:-.gpu}
stage=/tmp/kiln-gpu-graphs8
rm -rf "$stage" && mkdir -p "$stage" && tar -xJf "$bundle/kiln-gpu.tar.xz" -C "$stage"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$stage/lib
out=${OUT:-/tmp/out}
mkdir -p "$out"
bin=$stage/bin
res=$out/graphs8.json
: > "$res"
log=$out/graphs8.log
: > "$log"
iters=${GRAPHS8_ITERS:-40}
cache=/tmp/graphs8_cache  # kernels compile once per layer, in the export run
rm -rf "$cache"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "cores $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg)"
kiln() {  # label, then layers_bf16 arguments
  local label=$1; shift
  timeout 40 "$@" --label "$label" >> "$res" 2>> "$log"
  echo "  $label -> exit $?"
}
torch() {  # name, export dir, torch label, torch_layers.py flags
  local name=$1 dir=$2 label=$3; shift 3
  LD_LIBRARY_PATH= timeout 60 python3 "$here/torch_layers.py" "$dir" --e2e "$@" \
    | sed "s/\"impl\": \"torch_eager\"/\"impl\": \"$label:$name\"/" >> "$res" 2>> "$log"
  echo "  $label $name exit $?"
}
summary=$out/graphs8_summary.py
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
refs = {}
for label in ("torch", "torch_tf32"):
    t = next((r for r in rows if r.get("impl") == f"{label}:{name}"), None)
    if t:
        refs[label] = t.get("eager_sync_ms")
        print(f"  {label} {name}: per call+sync {t.get('eager_sync_ms', float('nan')):.3f} ms, "
              f"CUDA events {t['eager_ms']:.3f} ms, max|y-kiln f32| {t['max_abs_diff_vs_kiln']:.3g}")
for r in rows:
    impl = r.get("impl", "")
    if r.get("bench") != "layer_bf16" or not impl.endswith(":" + name) or "p50_ms" not in r:
        continue
    ratio = "".join(f", {r['p50_ms'] / v:.2f}x {k}" for k, v in refs.items() if v)
    print(f"  {impl}: Run p50 {r['p50_ms']:.3f} ms, busy {r['device_busy_ms']:.3f} ms, "
          f"graph '{r.get('cuda_graph')}' uses_graphs {r.get('uses_graphs')} "
          f"(kernels {r.get('kernels')}, estimate {r.get('estimate_us', 0):.0f} us, "
          f"launch {r.get('launch_us', 0):.1f} us){ratio}")
    if r.get("hops_us"):
        print("    hops (us): " + ", ".join(f"{k} {v:.1f}" for k, v in r["hops_us"].items()))
    if impl.startswith(("auto:", "tf32:")):
        print("    kernels (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in r["kernels_ms"].items()))
PY
run_layer() {  # name, dtype, batch, seq
  local name=$1
  L=("$bin/layers_bf16" --layer bert --dtype "$2" --batch "$3" --seq "$4")
  R=("${L[@]}" --io resident --iters "$iters" --cache_dir "$cache" --report last)
  echo "== $name"
  kiln "export:$name" "${L[@]}" --iters 3 --export "/tmp/graphs8_$name" --cache_dir "$cache"
}
run_layer bert_bf16 bf16 32 512
name=bert_bf16
kiln "auto:$name" "${R[@]}"
kiln "on:$name" "${R[@]}" --cuda_graphs on
kiln "off:$name" "${R[@]}" --cuda_graphs off
kiln "auto:$name" "${R[@]}"
kiln "on:$name" "${R[@]}" --cuda_graphs on
kiln "thread_auto:$name" "${R[@]}" --isolation thread
torch "$name" "/tmp/graphs8_$name" torch
rm -rf "/tmp/graphs8_$name"
python3 "$summary" "$res" "$name"

run_layer bert_f32 f32 8 128
name=bert_f32
kiln "auto:$name" "${R[@]}"
kiln "tf32:$name" "${R[@]}" --allow_tf32 on
kiln "auto:$name" "${R[@]}"
kiln "tf32:$name" "${R[@]}" --allow_tf32 on
kiln "thread_auto:$name" "${R[@]}" --isolation thread
kiln "thread_tf32:$name" "${R[@]}" --isolation thread --allow_tf32 on
torch "$name" "/tmp/graphs8_$name" torch
torch "$name" "/tmp/graphs8_$name" torch_tf32 --tf32
rm -rf "/tmp/graphs8_$name"
python3 "$summary" "$res" "$name"
grep -v '^\s*$' "$log" | grep -iv "warn\|info" | tail -8
