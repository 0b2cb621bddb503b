#!/usr/bin/env bash
# Issue 8, res8: what a cuda:0 Run through its device worker costs against PyTorch
# eager, with each side paying the same I/O, and the host arena before and after, in
# one call (docs/cuda.md "Where an isolated run's time goes"). Three layers:
# BERT bf16 B32 S512, the 7B-style decoder bf16 B4 S2048, BERT fp32 B8 S128.
# (a) tensors resident on the device: layers_bf16 --io resident (x a state param,
#     y written over it in place: Engine::CreateStateParams + state_updates) vs
#     PyTorch eager on GPU tensors, per call with a synchronize (eager_sync_ms), and
#     CUDA-event throughput (eager_ms) beside it;
# (b) end to end from host memory: layers_bf16 --io host (x uploaded, y read back;
#     fresh output tensors, or one reused destination) vs PyTorch with x on the host,
#     x.to('cuda', non_blocking=True), the layer, y back (pageable: y.cpu(); pinned:
#     into a pinned tensor), per call. Kiln "old" is main's path, one variable away:
#     KILN_HOST_ARENA_BYTES=0 (no arena: x and y memcpy'd through the worker's staging
#     region); "new" is the default (x and y in the host arena, DMA'd by reference).
# First the transport alone: transport_bench --backend cuda (an upload and a read-back
# of 3 / 25 / 64 MiB through the worker, heap buffers vs arena blocks) beside
# torch_transport.py (the same bytes from pinned and pageable memory).
# Bundle folder in KILN_GPU_BUNDLE: kiln-gpu.tar.xz (layers_bf16, kiln_cuda_test,
# transport_bench, kiln-device-worker), with torch_layers.py and torch_transport.py
# beside this script.
set -u
here=$(cd "$(dirname "$0")" && pwd)
bundle=${KILN_GPU_BUNDLE:-.gpu}
stage=/tmp/kiln-gpu-res8
rm -rf "$stage" && mkdir -p "$stage" && tar -xJf "$bundle/kiln-gpu.tar.xz" -C "$stage"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$stage/lib
out=${OUT:-/tmp/out}
mkdir -p "$out"
bin=$stage/bin
res=$out/res8.json
: > "$res"
log=$out/res8.log
: > "$log"
old=(env KILN_HOST_ARENA_BYTES=0)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "cores $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== kiln_cuda_test (registered host memory, copies)"
timeout 30 "$bin/kiln_cuda_test" --gtest_brief=1 \
  --gtest_filter='CudaDeviceTest.RegisteredHostMemoryCopiesDirectly:CudaDeviceTest.CopiesRoundTripThroughStaging' 2>&1 | tail -4
summary=$out/res8_summary.py
cat > "$summary" <<'PY'
import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
def med(v):
    return statistics.median(v) if v else float("nan")
for name in sys.argv[2:]:
    k = [r for r in rows if r.get("bench") == "layer_bf16" and "p50_ms" in r
         and r.get("impl", "").split(":")[1:2] == [name]]
    t = next((r for r in rows if r.get("impl") == f"torch:{name}"), None)
    p = lambda lab: [r["p50_ms"] for r in k if r["impl"] == lab]
    busy = med([r["device_busy_ms"] for r in k])
    print(f"--- {name}: device busy {busy:.3f} ms (Kiln's kernels, median over runs)")
    if t is None:
        print("    no torch row"); continue
    print(f"    torch: events {t['eager_ms']:.3f} ms, per call+sync {t.get('eager_sync_ms', float('nan')):.3f}, "
          f"e2e pageable {t.get('e2e_pageable_ms', float('nan')):.3f}, pinned {t.get('e2e_pinned_ms', float('nan')):.3f}; "
          f"max|y-kiln| {t['max_abs_diff_vs_kiln']:.3g}, e2e max|diff| {t.get('e2e_max_abs_diff', float('nan')):.3g}")
    res = p(f"resident:{name}")
    if res:
        print(f"    (a) resident: Kiln Run {med(res):.3f} ms / torch per call+sync {t['eager_sync_ms']:.3f} = "
              f"{med(res) / t['eager_sync_ms']:.2f}x; / torch events {med(res) / t['eager_ms']:.2f}x")
    for outputs in ("fresh", "reused"):
        o, n = p(f"old:{name}:{outputs}"), p(f"new:{name}:{outputs}")
        if not o or not n:
            print(f"    (b) {outputs}: missing runs"); continue
        print(f"    (b) host I/O, {outputs} outputs: old {' / '.join(f'{x:.3f}' for x in o)} ms, "
              f"new {' / '.join(f'{x:.3f}' for x in n)} ms, new/old {med(n) / med(o):.3f}; "
              f"new / torch pageable {med(n) / t['e2e_pageable_ms']:.2f}x, / pinned {med(n) / t['e2e_pinned_ms']:.2f}x; "
              f"old / pageable {med(o) / t['e2e_pageable_ms']:.2f}x, / pinned {med(o) / t['e2e_pinned_ms']:.2f}x")
PY
kiln() {  # label, then layers_bf16 arguments
  local label=$1; shift
  timeout 45 "$@" --label "$label" >> "$res" 2>> "$log"
  echo "  $label $* -> exit $?" | sed "s|$bin/||"
}
echo "== transport alone: an upload and a read-back through the cuda worker"
timeout 40 "$bin/transport_bench" --backend cuda --mib 3,25,64 --iters 20 2>> "$log" | tee -a "$res"
LD_LIBRARY_PATH= timeout 40 python3 "$here/torch_transport.py" --mib 3,25,64 --iters 20 2>> "$log" | tee -a "$res"
python3 - "$res" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
k = {r["mib"]: r for r in rows if r.get("bench") == "worker_transport" and "arena_ms" in r}
t = {r["mib"]: r for r in rows if r.get("bench") == "worker_transport" and r.get("impl") == "torch"}
for mib in sorted(k):
    line = (f"transport {mib} MiB up+down: Kiln staging (old) {k[mib]['staging_ms']:.3f} ms, "
            f"arena (new) {k[mib]['arena_ms']:.3f} ms, old/new {k[mib]['staging_over_arena']:.2f}x")
    if mib in t:
        line += (f"; torch pinned {t[mib]['pinned_ms']:.3f} ms, pageable {t[mib]['pageable_ms']:.3f} ms; "
                 f"new / pinned {k[mib]['arena_ms'] / t[mib]['pinned_ms']:.2f}x")
    print(line)
PY
cases=("bert --dtype bf16 --batch 32 --seq 512"
       "decoder --dtype bf16 --batch 4 --seq 2048"
       "bert --dtype f32 --batch 8 --seq 128")
names=(bert_bf16 decoder_bf16 bert_f32)
for i in 0 1 2; do
  name=${names[$i]}
  read -r -a c <<< "--layer ${cases[$i]}"
  echo "== $name"
  L=("$bin/layers_bf16" "${c[@]}" --iters 20)
  kiln "new:$name:fresh" "${L[@]}" --outputs fresh --export "/tmp/res8_$name"
  kiln "old:$name:fresh" "${old[@]}" "${L[@]}" --outputs fresh
  kiln "new:$name:fresh" "${L[@]}" --outputs fresh
  kiln "old:$name:reused" "${old[@]}" "${L[@]}" --outputs reused
  kiln "new:$name:reused" "${L[@]}" --outputs reused
  kiln "resident:$name" "${L[@]}" --io resident
  LD_LIBRARY_PATH= timeout 60 python3 "$here/torch_layers.py" "/tmp/res8_$name" --e2e \
    | sed "s/\"impl\": \"torch_eager\"/\"impl\": \"torch:$name\"/" >> "$res" 2>> "$log"
  echo "  torch_layers $name exit $?"
  rm -rf "/tmp/res8_$name"
  python3 "$summary" "$res" "$name"  # each layer's figures as soon as it is done
done
grep -v '^\s*$' "$log" | grep -iv "warn\|info" | tail -8
