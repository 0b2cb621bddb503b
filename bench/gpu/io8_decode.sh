#!/usr/bin/env bash
# Issue 8, io8 item 2: single-row decode attention. On the GPU machine, in one call:
# the whole kiln_cuda_test (the NVRTC compile of every entry point, the 16-byte split-K
# decode kernel against the f64 reference, cuDNN's cases, the copies), then attention_fwd --cases decode
# (Kiln's choice, cudnn:sdpa_fwd_bf16, beside Kiln's own kernel on a KILN_CUDNN=0
# device: nvrtc:attention_decode16_split<n>_bf16) and PyTorch SDPA (torch_attention.py)
# on the same shapes; prints ms, GB/s of K and V, and the ratios.
#   KILN_GPU_BUNDLE=.gpu/io8 bash .gpu/io8/io8_decode.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh"
export XDG_CACHE_HOME=/tmp/kiln-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# KILN_SKIP_CUDA_TEST=1: the call already ran kiln_cuda_test (device time is short).
if [[ -z ${KILN_SKIP_CUDA_TEST:-} ]]; then
  timeout 240 "$stage/bin/kiln_cuda_test" > "$out/decode_test.log" 2>&1
  echo "kiln_cuda_test exit $?"
  grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED|tests ran' "$out/decode_test.log"
  grep -E -B2 -A12 'Failure$|Segmentation|terminate|Aborted' "$out/decode_test.log" | head -60 | cut -c1-300
fi
for round in 1 2; do
  timeout 90 "$stage/bin/attention_fwd" --rounds 5 --cases decode >> "$out/decode.json" 2>> "$out/decode.log"
  echo "attention_fwd decode exit $?"
  LD_LIBRARY_PATH= timeout 60 python3 "$here/torch_attention.py" --rounds 5 --cases decode \
    >> "$out/decode.json" 2>> "$out/decode.log"
  echo "torch_attention decode exit $?"
done
tail -3 "$out/decode.log"
python3 - "$out/decode.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    extra = f" {r['kv_gbps']:.0f} GB/s of K+V" if "kv_gbps" in r else ""
    err = f" err {r['max_abs_err']:.1e}" if "max_abs_err" in r else ""
    print(f"{r['case']} {r['impl']} {r.get('implementation', '')} {r['ms']:.4f} ms{extra}{err}")
by = {}
for r in rows:
    by.setdefault(r["case"], {}).setdefault(r["impl"], []).append(r["ms"])
for case, d in by.items():
    med = {k: sorted(v)[len(v) // 2] for k, v in d.items()}
    t = med.get("torch_sdpa")
    line = f"{case}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in med.items())
    if t:
        line += " | speed vs SDPA: " + ", ".join(f"{k} {t / v:.3f}" for k, v in med.items() if k != "torch_sdpa")
    if "kiln" in med and "kiln_own" in med:
        line += f" | Kiln's kernel vs cuDNN speed {med['kiln'] / med['kiln_own']:.3f}"
    print(line)
PY
