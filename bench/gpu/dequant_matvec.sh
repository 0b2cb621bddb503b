#!/usr/bin/env bash
# On the GPU machine, after unpack.sh (or standalone): issue 10's DequantMatMul
# figures side by side in one call. Kiln's fused dequant kernels on cuda:0
# (q4_k and q8_0 weights of 4096 x 4096, 14336 x 4096 and 4096 x 14336,
# M = 1, 8, 16, 32, 64, 128 and 512) as GB/s of quantized weights against the copy bandwidth of
# its own process (dequant_matvec), and PyTorch's bf16 F.linear on the
# dequantized weights of the same shapes with its own copy
# (torch_dequant_matvec.py). Writes dequant_matvec.json and
# torch_dequant_matvec.json under $out; prints one line per shape.
#   $DEQUANT_BIN: the dequant_matvec binary (default $stage/bin/dequant_matvec)
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -z ${stage:-} ]]; then source "$here/unpack.sh"; fi
logs=${logs:-/tmp/cuda-logs}
mkdir -p "$logs"
bin=${DEQUANT_BIN:-$stage/bin/dequant_matvec}
#   $DEQUANT_ARGS: more flags for dequant_matvec and, where they mean the same
#   (--ms, --shapes), torch_dequant_matvec.py (e.g. "--ms=16,32 --act=bf16")
#   $KILN_DEQUANT_PATH: matvec|mma|tiled forces Kiln's kernel (default: by M)
#   $DEQUANT_TIMEOUT, $TORCH_TIMEOUT: seconds for each side (150, 120)
read -r -a extra <<< "${DEQUANT_ARGS:-}"
torch_extra=()
for a in "${extra[@]}"; do
  [[ $a == --ms=* ]] && torch_extra+=(--ms "${a#--ms=}")
  [[ $a == --shapes=* ]] && torch_extra+=(--shapes "${a#--shapes=}")
done
timeout "${DEQUANT_TIMEOUT:-150}" "$bin" --device=cuda:0 "${extra[@]}" > "$out/dequant_matvec.json" 2> "$logs/dequant_matvec.log"
echo "dequant_matvec exit $?"
LD_LIBRARY_PATH= timeout "${TORCH_TIMEOUT:-120}" python3 "$here/torch_dequant_matvec.py" "${torch_extra[@]}" \
  > "$out/torch_dequant_matvec.json" 2>> "$logs/dequant_matvec.log"
echo "torch_dequant_matvec exit $?"
tail -n 20 "$logs/dequant_matvec.log" | cut -c1-300
python3 - "$out/dequant_matvec.json" "$out/torch_dequant_matvec.json" <<'PY'
import json, sys
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        print(f"no results in {p}: {e}")
        return None
k, t = load(sys.argv[1]), load(sys.argv[2])
if not k:
    sys.exit(0)
print(f"{k['name']}: copy in Kiln's process {k['copy_gbps']:.0f} GB/s"
      + (f"; in torch {t['torch']}'s {t['copy_gbps']:.0f} GB/s" if t else ""))
tor = {(r["n"], r["k"], r["m"]): r for r in (t or {}).get("results", [])}
for r in k["results"]:
    if "gbps" not in r:
        print(f"  {r['type']} {r['n']}x{r['k']} m={r['m']}: {r.get('error')}")
        continue
    line = (f"  {r['type']} {r['n']}x{r['k']} m={r['m']} {r.get('act', 'f32')}: kiln {r['ms']*1e3:.1f} us "
            f"{r['gbps']:.0f} GB/s = {r['of_copy']:.3f} of copy ({r['impl']}, rel err "
            f"{r['max_rel_err']:.1e})")
    p = tor.get((r["n"], r["k"], r["m"]))
    if p:
        line += (f"; torch bf16 {p['ms']*1e3:.1f} us {p['gbps']:.0f} GB/s = {p['of_copy']:.3f}"
                 f" of its copy; torch/kiln time {p['ms'] / r['ms']:.2f}")
    print(line)
PY
