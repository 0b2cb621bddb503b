#!/usr/bin/env bash
# Every benchmark of issue 12 (serving latency), one after the other, each
# running our code and its peer side by side and printing its own ratio;
# ~6-8 minutes on the 2-core VM. Meant for a quiet host: the load average is
# printed before each bench (compare only figures of one run).
#
#   bench/issue12_all.sh [BUILD_DIR] [OUT_DIR]
#
# Needs the targets kilnd kiln_bench kiln_wire kiln_load kiln_shm_bench
# kiln_python, and ONNX Runtime's npm package in bench/ort (encoder_vs_ort.py
# installs it). Each bench's JSON goes to OUT_DIR/<name>.json (default: a
# new temp dir); one "== name: ..." summary line per bench goes to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
out=${2:-$(mktemp -d /tmp/issue12_all.XXXXXX)}
mkdir -p "$out"
py=/usr/bin/python3
export PYTHONPATH="$build/clients/python"
# The peers' malloc keeps freed multi-MB buffers, as kilnd's does (MACHINE.md).
malloc="glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456"
failed=0

# run NAME CMD...: the command's last stdout line (its JSON) into OUT/NAME.json.
run() {
  local name=$1
  shift
  echo "-- $name (load $(cut -d' ' -f1 /proc/loadavg), $(date -u +%H:%M:%S) UTC): $*" >&2
  if "$@" 2>"$out/$name.err" | tail -1 >"$out/$name.json" && [[ -s "$out/$name.json" ]]; then
    summarize "$name"
  else
    echo "== $name: FAILED (see $out/$name.err)"
    failed=1
  fi
}

summarize() {
  "$py" - "$1" "$out/$1.json" <<'EOF'
import json, sys
name, path = sys.argv[1], sys.argv[2]
j = json.load(open(path))
f = lambda v, d=2: f"{v:.{d}f}"
if name == "mlp_vs_ort":
    s = "; ".join(f"b{r['batch']}: Kiln {f(r['kiln_p50_ms'], 3)} ms, ORT {f(r['ort_p50_ms'], 3)} ms, "
                  f"Kiln/ORT {f(r['kiln_over_ort'])} (target <= 1.0)" for r in j["results"])
elif name.startswith("encoder_vs_ort"):
    s = (f"Kiln {f(j['kiln_p50_ms'])} ms, ORT {f(j['ort_p50_ms'])} ms, Kiln/ORT "
         f"{f(j['kiln_over_ort'], 3)} (target <= 0.8)")
elif name == "kilnd_vs_ort":
    m, e = j["mlp_b1"], j["encoder_layer"]
    med, py = m["medians"], e["python_client"]["medians"]
    # One entry per transport (bytes, shm over gRPC, shm_run over the socket).
    mlp = ", ".join(f"{t} +{f(v['kilnd_minus_ort_and_round_trip_us'], 0)}"
                    for t, v in med.items() if isinstance(v, dict))
    grpc = e.get("cpp_client_grpc_run", {}).get("overhead_pct_of_medians")
    s = (f"MLP b1 through kilnd vs ORT {f(med['ort_in_process_us'], 0)} us + round trip, added us: "
         f"{mlp} (target <= 60); encoder through kilnd vs in process: C++ "
         f"+{f(e['cpp_client']['overhead_pct_of_medians'], 1)}% "
         f"({'socket run' if e['cpp_client'].get('shm_run') else 'shm' if e['cpp_client']['shared_memory'] else 'bytes'})"
         + (f" / +{f(grpc, 1)}% (gRPC run)" if grpc is not None else "")
         + f", Python +{f(py['shared_memory_added_pct'], 1)}% (default: socket run)"
         + (f" / +{f(py['shm_grpc_added_pct'], 1)}% (shm, gRPC run)" if "shm_grpc_added_pct" in py else "")
         + f" / +{f(py['bytes_added_pct'], 1)}% (bytes) (target <= 5%)")
elif name == "kiln_wire":
    a, b = j["four_mib"], j["mlp_b1"]
    s = (f"4 MiB each way over gRPC: added {f(a['added_p50_ms'])} ms (target <= 2)"
         + (f", bare gRPC echo of the same bytes {f(a['bare_grpc']['p50_us'] / 1000)} ms "
            f"(added / bare {f(a['added_over_bare_grpc_ratio'])})" if "bare_grpc" in a else "")
         + f"; MLP b1: kilnd "
         f"- Kiln in process - round trip = {f(b['kilnd_minus_in_process_and_round_trip_p50_us'], 0)} us")
elif name == "kiln_shm_bench":
    s = (f"4 MiB each way, added p50: gRPC TCP {f(j['grpc']['added_ms_p50'])} ms, gRPC Unix socket "
         f"{f(j['grpc_unix']['added_ms_p50'])} ms (TCP/Unix {f(j['grpc_tcp_over_unix_added'])}), "
         f"shm copy {f(j['shm_copy']['added_ms_p50'])} ms, shm in place "
         f"{f(j['shm_inplace']['added_ms_p50'])} ms (gRPC run)"
         + (f" / {f(j['shm_inplace_socket']['added_ms_p50'])} ms (socket run)"
            if "shm_inplace_socket" in j else "")
         + " (targets: gRPC <= 2, shm <= 0.2)")
elif name == "python_client_overhead":
    s = "; ".join(f"{r['bytes_each_way']} B each way: client {f(r['client']['p50_us'], 0)} us vs bare "
                  f"grpcio {f(r['bare_grpcio']['p50_us'], 0)} us (+{f(r['added_p50_us'], 0)} us)"
                  for r in j["results"])
elif name.startswith("batching"):
    b = j["batching"]
    s = (f"{b['model']}, {b['callers']} callers: off {f(b['off_runs_per_s_median'], 0)} runs/s, on "
         f"{f(b['on_runs_per_s_median'], 0)} runs/s, on/off {f(b['ratio_median_of_blocks'])} "
         f"(target >= 2); CPU per run off/on {f(b['cpu_per_run_off_over_on'])}")
else:
    s = "done"
print(f"== {name}: {s}")
EOF
}

GLIBC_TUNABLES=$malloc run mlp_vs_ort "$py" bench/mlp_vs_ort.py "$build" --rounds 5 --iters 300
GLIBC_TUNABLES=$malloc run encoder_vs_ort "$py" bench/encoder_vs_ort.py "$build" --rounds 5 --iters 30
GLIBC_TUNABLES=$malloc run encoder_vs_ort_12 "$py" bench/encoder_vs_ort.py "$build" --layers 12 \
  --rounds 3 --iters 8
run kilnd_vs_ort "$py" bench/kilnd_vs_ort.py "$build" --rounds 5
run kiln_wire "$build/bench/kiln_wire" --blocks 6
run kiln_shm_bench "$build/bench/kiln_shm_bench" --blocks 6 --runs 10
GLIBC_TUNABLES=$malloc run python_client_overhead "$py" bench/python_client_overhead.py \
  --kilnd "$build/server/kilnd" --calls 1000
run batching_mlp "$build/bench/kiln_load" --batching --batching-model mlp --batching-seconds 3 \
  --batching-blocks 3
# 5 s blocks: the warm-up (3 x 5 s) must compile every batch size first.
run batching_encoder "$build/bench/kiln_load" --batching --batching-model encoder \
  --batching-seconds 5 --batching-blocks 2
echo "(JSON of each bench in $out)"
exit $failed
