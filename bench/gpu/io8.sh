#!/usr/bin/env bash
# Issue 8, io8: the host I/O of a run on cuda:0 in its device worker, before and
# after, in one call (docs/cuda.md "Where an isolated run's time goes"). The
# earlier path is the same build with KILN_HOST_COPY_THREADS=1 (one memcpy per
# host copy), KILN_WORKER_UPLOAD_PIECE_BYTES=0 (an upload crosses whole, at the
# run's synchronize) and KILN_HOST_BUFFER_POOL_BYTES=0 (every large output new pages). Bundle folder in KILN_GPU_BUNDLE (kiln-gpu.tar.xz with
# kiln_cuda_test, layers_bf16, kiln_bench, host_copy_bench and kiln-device-worker;
# unpack.sh, torch_layers.py and torch_encoder.py beside it). Prints:
# - kiln_cuda_test (the CUDA device tests, the registered-memory copy among them);
# - host_copy_bench 3 / 25 / 64 MiB: one memcpy vs HostCopier, into reused, fresh and pooled pages;
# - layers_bf16 bert (B32 S512) and decoder (B4 S2048): Run p50 old vs new, with fresh
#   outputs (old / new alternating, twice) and with a reused output destination (once), and
#   PyTorch eager (torch_layers.py) on the same weights;
# - kiln_bench encoder (fp32 BERT layer B8 S128) old vs new, twice, and PyTorch eager.
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh"
bin=$stage/bin
res=$out/io8.json
: > "$res"
log=$out/io8.log
old=(env KILN_HOST_COPY_THREADS=1 KILN_WORKER_UPLOAD_PIECE_BYTES=0 KILN_HOST_BUFFER_POOL_BYTES=0)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nproc
echo "== kiln_cuda_test"
timeout 120 "$bin/kiln_cuda_test" --gtest_brief=1 \
  --gtest_filter='CudaDeviceTest.CopiesRoundTripThroughStaging:CudaDeviceTest.RegisteredHostMemoryCopiesDirectly:CudaDeviceTest.OverlappingDeviceCopy:CudaDeviceTest.EventsTimeAndOrderStreams:CudaDeviceTest.CapturedGraphReplaysKernelsAndEvents:CudaDeviceTest.DiscoveryAndProfile' 2>&1 | tail -15
echo "== host_copy_bench"
for mib in 3 25 64; do
  timeout 60 "$bin/host_copy_bench" --mib $mib --iters 20 | tee -a "$res"
done
echo "== layers_bf16"
for layer in bert decoder; do
  for round in 1 2; do
    outs=(fresh reused); [[ $round == 2 ]] && outs=(fresh)
    for outputs in "${outs[@]}"; do
      exp=()
      [[ $round == 1 && $outputs == fresh ]] && exp=(--export "/tmp/layer_$layer")
      timeout 60 "${old[@]}" "$bin/layers_bf16" --layer $layer --iters 20 --outputs $outputs \
        --label kiln_old >> "$res" 2>> "$log"
      echo "$layer old $outputs exit $?"
      timeout 60 "$bin/layers_bf16" --layer $layer --iters 20 --outputs $outputs \
        --label kiln_new "${exp[@]}" >> "$res" 2>> "$log"
      echo "$layer new $outputs exit $?"
    done
  done
  LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_layers.py" "/tmp/layer_$layer" >> "$res" 2>> "$log"
  echo "torch_layers $layer exit $?"
  rm -rf "/tmp/layer_$layer"
done
echo "== encoder fp32 B8 S128"
for round in 1 2; do
  exp=(); [[ $round == 1 ]] && exp=(--export /tmp/enc_cuda)
  timeout 120 "${old[@]}" "$bin/kiln_bench" encoder --device cuda:0 --batch 8 --iters 60 \
    --threads 16 2>> "$log" | sed 's/"impl":"kiln"/"impl":"kiln_old"/' >> "$res"
  echo "encoder old exit $?"
  timeout 120 "$bin/kiln_bench" encoder --device cuda:0 --batch 8 --iters 60 --threads 16 \
    "${exp[@]}" 2>> "$log" | sed 's/"impl":"kiln"/"impl":"kiln_new"/' >> "$res"
  echo "encoder new exit $?"
done
LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_encoder.py" /tmp/enc_cuda >> "$res" 2>> "$log"
echo "torch encoder exit $?"
tail -5 "$log"
python3 - "$res" <<'PY'
import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
for r in rows:
    if r.get("bench") == "host_copy":
        print(f"host copy {r['mib']} MiB {r['destination']}: memcpy {r['memcpy_ms']:.3f} ms "
              f"({r['memcpy_gbps']:.1f} GB/s), HostCopier x{r['threads']} {r['host_copier_ms']:.3f} ms "
              f"({r['host_copier_gbps']:.1f} GB/s), {r['speedup']:.2f}x")
lay = [r for r in rows if r.get("bench") == "layer_bf16"]
for layer in ("bert", "decoder"):
    t = next((r for r in rows if r.get("layer") == layer and r.get("impl") == "torch_eager"), None)
    for outputs in ("fresh", "reused"):
        sel = [r for r in lay if r["layer"] == layer and r.get("outputs") == outputs]
        o = [r["p50_ms"] for r in sel if r["impl"] == "kiln_old"]
        n = [r["p50_ms"] for r in sel if r["impl"] == "kiln_new"]
        b = [r["device_busy_ms"] for r in sel]
        if not o or not n:
            print(f"layer {layer} {outputs}: missing runs"); continue
        line = (f"layer {layer} outputs {outputs}: Run p50 old {' / '.join(f'{x:.3f}' for x in o)} ms, "
                f"new {' / '.join(f'{x:.3f}' for x in n)} ms, new/old {statistics.median(n) / statistics.median(o):.3f}; "
                f"device busy {statistics.median(b):.3f} ms")
        if t:
            line += f"; eager {t['eager_ms']:.3f} ms, new Run / eager {statistics.median(n) / t['eager_ms']:.2f}"
        print(line)
    if t:
        print(f"    torch vs kiln max |diff| {t['max_abs_diff_vs_kiln']:.3g}")
enc = [r for r in rows if r.get("bench") == "encoder_layer_fp32"]
eager = next((r for r in rows if r.get("impl") == "pytorch-eager-cuda"), None)
med = {}
for impl in ("kiln_old", "kiln_new"):
    v = [r["p50_ms"] for r in enc if r["impl"] == impl]
    b = [r["device_busy_ms"] for r in enc if r["impl"] == impl]
    if v:
        med[impl] = statistics.median(v)
        print(f"encoder fp32 B8 S128 {impl}: p50 {' / '.join(f'{x:.3f}' for x in v)} ms, "
              f"device busy {statistics.median(b):.3f} ms")
if len(med) == 2:
    print(f"encoder new/old {med['kiln_new'] / med['kiln_old']:.3f}")
if eager:
    line = f"encoder eager p50 {eager['p50_ms']:.3f} ms"
    if "kiln_new" in med:
        line += f", new / eager {med['kiln_new'] / eager['p50_ms']:.2f}"
    if "max_abs_diff_vs_kiln" in eager:
        line += f", max |diff| {eager['max_abs_diff_vs_kiln']:.3g}"
    print(line)
PY
