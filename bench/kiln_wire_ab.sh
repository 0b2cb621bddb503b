#!/bin/bash
# kiln_wire_ab.sh: 4 MiB each way through kilnd, a baseline build against this
# one in one run (docs/benchmarks.md, "wire12"). Rounds alternate the two
# (kiln_wire = the C++ client, kilnd); every kiln_wire run also times its bare
# gRPC echo of the same bytes (gRPC's own floor) in the same blocks. Prints one
# line per run and the medians; "this / base" < 1 means this build adds less.
#
#   bench/kiln_wire_ab.sh BASE_KILN_WIRE BASE_KILND [BUILD_DIR] [ROUNDS] [kiln_wire flags...]
#
# e.g. copy main's build/bench/kiln_wire and build/server/kilnd aside first.
# Each kiln_wire run takes ~20-40 s (4 blocks of 10 calls after 60 untimed).
set -euo pipefail
base_wire=$1
base_kilnd=$2
build=${3:-build}
rounds=${4:-3}
shift $(($# < 4 ? $# : 4))
py=/usr/bin/python3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$rounds"); do
  for side in base this; do
    if [[ $side == base ]]; then wire=$base_wire kilnd=$base_kilnd; else
      wire=$build/bench/kiln_wire kilnd=$build/server/kilnd; fi
    timeout 300 "$wire" --cases four_mib --blocks 4 --runs 10 --warmup 60 --kilnd "$kilnd" "$@" \
      2>"$out/err" | tail -1 >"$out/$side.$i.json" || { cat "$out/err" >&2; exit 1; }
    "$py" - "$side" "$out/$side.$i.json" <<'EOF'
import json, sys
side, j = sys.argv[1], json.load(open(sys.argv[2]))
a = j["four_mib"]
line = f"{side:4} load {j['machine']['load_1min']:5.1f}: added p50 {a['added_p50_ms']:.3f} ms"
if "bare_grpc" in a:
    line += f", bare gRPC {a['bare_grpc']['p50_us'] / 1000:.3f} ms"
if "kilnd_costs" in a:
    c = a["kilnd_costs"]
    line += (f", CPU per call client {c['client_cpu_us_per_call']:.0f} us / kilnd "
             f"{c['server_cpu_us_per_call']:.0f} us, page faults {c['client_page_faults_per_call']:.1f} / "
             f"{c['server_page_faults_per_call']:.1f}")
print(line)
EOF
  done
done
"$py" - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def runs(side):
    return [json.load(open(f"{out}/{side}.{i}.json"))["four_mib"] for i in range(1, rounds + 1)]
base, this = runs("base"), runs("this")
def med(rs, f):
    v = [f(r) for r in rs if f(r) is not None]
    return statistics.median(v) if v else None
rows = [("added p50, ms", lambda r: r["added_p50_ms"]),
        ("client CPU per call, us", lambda r: r.get("kilnd_costs", {}).get("client_cpu_us_per_call")),
        ("kilnd CPU per call, us", lambda r: r.get("kilnd_costs", {}).get("server_cpu_us_per_call")),
        ("bare gRPC p50, ms", lambda r: r["bare_grpc"]["p50_us"] / 1000 if "bare_grpc" in r else None)]
for name, f in rows:
    b, t = med(base, f), med(this, f)
    if b is None or t is None:
        continue
    print(f"== {name}: base {b:.3f}, this {t:.3f}, this / base {t / b:.3f} (medians of {rounds} runs)")
EOF
