#!/usr/bin/env bash
# GroupNorm on the GPU machine: Kiln's group_norm_bench (cuda:0 and vulkan:0)
# beside PyTorch's F.group_norm (torch_group_norm.py) on the same shapes, in
# one run, bf16 and f32; prints each side's ms and the ratio Kiln / PyTorch
# (time: below 1 is faster), and writes the JSON to $out.
#   GROUP_NORM_BIN=<stage>/bin/group_norm_bench out=<dir> bash bench/gpu/group_norm.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=${GROUP_NORM_BIN:?path of group_norm_bench}
out=${out:-/tmp/out}
mkdir -p "$out"
for dt in bf16 f32; do
  for dev in cuda:0 vulkan:0; do
    timeout 120 "$bin" --device "$dev" --dtype "$dt" > "$out/group_norm_${dev%:0}_$dt.json" \
      2> "$out/group_norm_${dev%:0}_$dt.log"
    echo "kiln $dev $dt: exit $?"
  done
  timeout 120 python3 "$here/torch_group_norm.py" --dtype "$dt" > "$out/group_norm_torch_$dt.json"
  echo "torch $dt: exit $?"
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception as e:
        return {"results": [], "error": str(e)}
for dt in ("bf16", "f32"):
    torch = {tuple(r["shape"]): r for r in load(f"group_norm_torch_{dt}.json")["results"]}
    for dev in ("cuda", "vulkan"):
        k = load(f"group_norm_{dev}_{dt}.json")
        for r in k["results"]:
            t = torch.get(tuple(r["shape"]))
            if "ms" not in r or t is None:
                print(dev, dt, r.get("shape"), "error:", r.get("error"))
                continue
            print(f"{dev:6s} {dt:4s} {str(r['shape']):20s} kiln {r['ms']:.4f} ms "
                  f"({r['of_copy']:.2f} of copy, err {r['max_abs_err']:.2g})  "
                  f"torch {t['ms']:.4f} ms ({t['of_copy']:.2f} of copy)  kiln/torch {r['ms'] / t['ms']:.2f}")
PY
