#!/usr/bin/env bash
# On the GPU machine (device tool, carry the bundle): issue 8's last two benchmark rows.
# 1. Compile of the bf16 7B-style decoder layer for cuda:0, cold vs warm disk cache, each
#    compile in a fresh process (layers_bf16 --compile_once DIR): cold with an empty
#    DIR (NVRTC compiles every generated kernel), warm with the DIR the cold run filled
#    (cubins loaded from the kernel level of the cache). 3 rounds. Target: warm <= 50 ms
#    including the cubin load (the first run's time is printed too: anything the compile
#    leaves to the first use is there; the second run's beside it), with the compile
#    report's stages (load.*: where loading the program onto the device went) and
#    Engine::Create's time (engine_start_ms: the worker's start, libraries, calibration).
# 2. kiln_bench placement with cuda:0 present: the 15 graphs on every device and on auto.
#    Target: auto within 10% of the best device for >= 95%.
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2 3; do
  dir=/tmp/kiln-compile-cache-$r
  rm -rf "$dir"
  for phase in cold warm; do
    timeout 120 "$stage/bin/layers_bf16" --layer decoder --compile_once "$dir" \
      | sed "s/^{/{\"round\":$r,\"phase\":\"$phase\",/" | tee -a "$out/compile.json"
  done
done
python3 - "$out/compile.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:  # where each compile went: the report's stages of 0.5 ms or more
    st, n = r.get("stages_ms", {}), r.get("load_counts", {})
    print(f"r{r['round']} {r['phase']}: " + "  ".join(
        f"{k}={v:.1f}" + (f"x{n[k]}" if k in n else "") for k, v in st.items() if v >= 0.5))
for phase in ("cold", "warm"):
    c = [r["compile_ms"] for r in rows if r["phase"] == phase]
    f = [r["first_run_ms"] for r in rows if r["phase"] == phase]
    s2 = [r.get("second_run_ms", 0) for r in rows if r["phase"] == phase]
    e = [r.get("engine_start_ms", 0) for r in rows if r["phase"] == phase]
    caches = sorted({r["cache"] for r in rows if r["phase"] == phase})
    if c:
        print(f"decoder compile {phase}: median {statistics.median(c):.1f} ms (all {', '.join(f'{x:.1f}' for x in c)}), "
              f"first run {statistics.median(f):.1f} ms (second {statistics.median(s2):.1f}), "
              f"engine start {statistics.median(e):.1f} ms, cache {caches}")
PY
timeout 300 "$stage/bin/kiln_bench" placement --threads 16 > "$out/placement.json" 2> "$out/placement.log"
echo "placement exit $?"
python3 - "$out/placement.json" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"): continue
    d = json.loads(line)
    for k in ("accuracy", "graphs", "auto_fastest_or_within_10pct", "devices"):
        if k in d: print(k, json.dumps(d[k])[:600])
    for g in d.get("results", []):
        print(json.dumps(g)[:300])
PY
