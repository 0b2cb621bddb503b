#!/usr/bin/env bash
# Sourced-free part of cudnn_attention.sh (same bundle): the bf16 BERT-base layer
# B32 S512 and the 7B-style decoder layer B4 S2048 on cuda:0 (layers_bf16, CUDA graphs
# auto), each beside PyTorch eager on the same weights (torch_layers.py); prints
# Kiln's device busy time and Run's p50 against eager, and the kernels' times.
set -u
stage=${stage:-/tmp/kiln-gpu}
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}
logs=$out/logs
mkdir -p "$logs"
for layer in bert decoder; do
  timeout 150 "$stage/bin/layers_bf16" --layer "$layer" --iters 20 --export "/tmp/layer_$layer" \
    >> "$out/layers.json" 2>> "$logs/layers.log"
  echo "layers_bf16 $layer exit $?"
  # The same layer on Kiln's own attention kernel (no cuDNN).
  KILN_CUDNN=0 timeout 150 "$stage/bin/layers_bf16" --layer "$layer" --iters 20 --label kiln_own \
    >> "$out/layers.json" 2>> "$logs/layers.log"
  echo "layers_bf16 $layer (KILN_CUDNN=0) exit $?"
  LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_layers.py" "/tmp/layer_$layer" \
    >> "$out/layers.json" 2>> "$logs/layers.log"
  echo "torch_layers $layer exit $?"
done
tail -5 "$logs/layers.log"
python3 - "$out/layers.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for layer, target in (("bert", 0.8), ("decoder", 0.95)):
    k = next((r for r in rows if r["layer"] == layer and r["impl"] == "kiln"), None)
    o = next((r for r in rows if r["layer"] == layer and r["impl"] == "kiln_own"), None)
    t = next((r for r in rows if r["layer"] == layer and r["impl"] == "torch_eager"), None)
    if not k:
        print(f"layer {layer}: no Kiln result"); continue
    line = (f"layer {layer} bf16 {k['config']}: kiln device busy {k['device_busy_ms']:.3f} ms, "
            f"Run p50 {k['p50_ms']:.3f} ms ({k['cuda_graph'] or 'kernel by kernel'})")
    if t:
        line += (f" | torch eager {t['eager_ms']:.3f} ms | kiln busy / eager "
                 f"{k['device_busy_ms'] / t['eager_ms']:.3f} (target <= {target}), "
                 f"Run p50 / eager {k['p50_ms'] / t['eager_ms']:.3f}; max |diff| "
                 f"{t['max_abs_diff_vs_kiln']:.3g}, mean {t['mean_abs_diff_vs_kiln']:.3g}")
    print(line)
    if o:
        print(f"    without cuDNN (KILN_CUDNN=0): device busy {o['device_busy_ms']:.3f} ms"
              + (f", busy / eager {o['device_busy_ms'] / t['eager_ms']:.3f}" if t else ""))
    for impl, ms in sorted(k["kernels_ms"].items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {ms:8.3f} ms  {impl}")
PY
