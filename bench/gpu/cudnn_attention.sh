#!/usr/bin/env bash
# On the GPU machine (device tool, carry the bundle folder; issue 8, cuDNN
# attention): kiln_cuda_test (its cuDNN cases: cuDNN vs an f64 reference, the
# fallbacks, the plan cache, a captured graph; the strided copies; the rest of
# the CUDA tests), then attention_fwd: the backend's choice (cudnn:sdpa_fwd_bf16)
# and Kiln's own kernel (KILN_CUDNN=0) beside PyTorch SDPA (torch_attention.py)
# in the same call; prints the ratios; logs and JSON
# under $OUT. Then, when the bundle has them, the bf16 layer benchmarks.
#   KILN_GPU_BUNDLE=.gpu/cudnn8 bash .gpu/cudnn8/cudnn_attention.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh"
export XDG_CACHE_HOME=/tmp/kiln-cache
logs=$out/logs
mkdir -p "$logs"
summary() { grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$1" | tr '\n' ' '; }
failures() { grep -E -B2 -A12 'Failure$|Segmentation|terminate|Aborted' "$1" | head -80 | cut -c1-400; }
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ls -l /usr/lib/x86_64-linux-gnu/libcudnn.so.9* /usr/local/cuda/lib64/libcudnn.so.9* 2>&1 | head -4
LD_LIBRARY_PATH= python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
export CUDNN_LOGLEVEL_DBG=${CUDNN_LOGLEVEL_DBG:-1} CUDNN_LOGDEST_DBG=$logs/cudnn_dbg.log
timeout 240 "$stage/bin/kiln_cuda_test" > "$out/cuda_test.log" 2>&1
echo "kiln_cuda_test exit $?: $(summary "$out/cuda_test.log")"
grep -E 'max \|error\||^cuda:0: |cudnn plan' "$out/cuda_test.log" | cut -c1-200
failures "$out/cuda_test.log"
head -c 3000 "$logs/cudnn_dbg.log" 2>/dev/null
timeout 240 "$stage/bin/attention_fwd" --rounds 5 --cases big > "$out/attention.json" 2> "$logs/attention.log"
echo "attention_fwd big exit $?"; tail -3 "$logs/attention.log"
timeout 120 "$stage/bin/attention_fwd" --rounds 5 --cases decode >> "$out/attention.json" 2>> "$logs/attention.log"
echo "attention_fwd decode exit $?"; tail -3 "$logs/attention.log"
LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_attention.py" --rounds 5 --cases big >> "$out/attention.json" 2>> "$logs/attention.log"
LD_LIBRARY_PATH= timeout 60 python3 "$here/torch_attention.py" --rounds 5 --cases decode >> "$out/attention.json" 2>> "$logs/attention.log"
echo "torch_attention exit $?"
python3 - "$out/attention.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault(r["case"], {})[r["impl"]] = r
for case, d in by.items():
    t = d.get("torch_sdpa")
    parts = []
    for impl in ("kiln", "kiln_own"):
        r = d.get(impl)
        if not r:
            continue
        ratio = f" = {t['ms'] / r['ms']:.3f}x SDPA speed" if t else ""
        parts.append(f"{impl} {r['implementation']} {r['ms']:.4f} ms {r['tflops']:.1f} TFLOP/s"
                     f" err {r['max_abs_err']:.1e}{ratio}")
    sdpa = f"SDPA {t['ms']:.4f} ms {t['tflops']:.1f} TFLOP/s" if t else "SDPA -"
    print(f"attention {case}: " + " | ".join(parts) + f" | {sdpa}")
PY
if [[ -x $here/cudnn_layers.sh ]]; then bash "$here/cudnn_layers.sh"; fi
date -u
echo done
