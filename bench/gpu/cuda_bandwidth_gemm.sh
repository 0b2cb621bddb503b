#!/usr/bin/env bash
# On the GPU machine, after unpack.sh (sourced by cuda.sh, or standalone):
# issue 8's bandwidth and GEMM figures, each side by side in one call.
#  (a) LayerNorm / RmsNorm / GELU on 8192 x 8192 bf16 on Kiln's cuda:0 vs a
#      device-to-device copy in the same process (bandwidth_vs_copy), and
#      PyTorch eager with its own copy (torch_bandwidth.py): GB/s and the
#      fraction of copy bandwidth, each against the copy of its own process.
#  (b) bf16 GEMM 4096^3 and 8192^3, plain (vs cublasGemmEx) and with the
#      bias + GELU (tanh) epilogue (vs cuBLASLt GELU_BIAS), in one process.
# Writes bandwidth.json, torch_bandwidth.json and gemm_bf16.json under $OUT
# and prints one line per figure.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -z ${stage:-} ]]; then source "$here/unpack.sh"; fi
logs=${logs:-/tmp/cuda-logs}
mkdir -p "$logs"
timeout 120 "$stage/bin/bandwidth_vs_copy" --device cuda:0 --rows 8192 --cols 8192 --dtype bf16 \
  > "$out/bandwidth.json" 2> "$logs/bandwidth.log"
echo "bandwidth_vs_copy exit $?"
LD_LIBRARY_PATH= timeout 120 python3 "$here/torch_bandwidth.py" --rows 8192 --cols 8192 \
  --dtype bf16 > "$out/torch_bandwidth.json" 2>> "$logs/bandwidth.log"
echo "torch_bandwidth exit $?"
timeout 200 "$stage/bin/matmul_vs_cublas" --device cuda:0 --dtypes bf16 --sizes 4096,8192 \
  --epilogues none,bias_gelu --reps 20 > "$out/gemm_bf16.json" 2> "$logs/gemm_bf16.log"
echo "matmul_vs_cublas (bf16, epilogues) exit $?"
tail -n 5 "$logs/bandwidth.log" "$logs/gemm_bf16.log" | cut -c1-300
python3 - "$out/bandwidth.json" "$out/torch_bandwidth.json" "$out/gemm_bf16.json" <<'PY'
import json, sys
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        print(f"no results in {p}: {e}")
        return None
k, t, g = (load(p) for p in sys.argv[1:4])
if k:
    print(f"copy in Kiln's process: {k['copy_gbps']:.0f} GB/s ({k['copy_ms']:.4f} ms)")
    tor = {r["op"]: r for r in (t or {}).get("results", [])}
    for r in k["results"]:
        if "gbps" not in r:
            print(f"  {r['op']}: {r.get('error')}")
            continue
        line = (f"  {r['op']} {k['rows']}x{k['cols']} {k['dtype']}: kiln {r['ms']:.4f} ms "
                f"{r['gbps']:.0f} GB/s = {r['of_copy']:.3f} of copy ({r['impl']}, "
                f"max abs err {r.get('max_abs_err', 0):.3g})")
        p = tor.get(r["op"])
        if p:
            line += (f"; torch {p['ms']:.4f} ms {p['gbps']:.0f} GB/s = {p['of_copy']:.3f} of its copy "
                     f"({t['copy_gbps']:.0f} GB/s); torch/kiln time {p['ms'] / r['ms']:.3f}")
        print(line)
if g:
    for row in g["results"]:
        for key in ("bf16", "bf16_bias_gelu"):
            e = row.get(key)
            if e:
                print(f"gemm n={row['n']} {key}: kiln {e['kiln_ms']:.4f} ms ({e['kiln_tflops']:.0f} TFLOP/s) "
                      f"vs cuBLAS{'Lt' if 'gelu' in key else ''} {e['cublas_ms']:.4f} ms "
                      f"({e['cublas_tflops']:.0f}): ratio {e['ratio']:.3f}, rel err {e['max_rel_err']:.2e}, "
                      f"{e['impl']}")
PY
