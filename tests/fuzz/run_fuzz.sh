#!/usr/bin/env bash
# One bounded libFuzzer run (ctest: kiln_fuzz_<name>):
#   run_fuzz.sh <target binary> <seed corpus> <work dir> <seconds>
# Starts from the checked-in seeds plus what earlier runs in this build tree
# found (<work dir>/corpus); new inputs go there only. A crash, leak, timeout or
# sanitizer report fails the run and leaves the input in <work dir>/ (crash-*,
# leak-*, timeout-*, oom-*): fix the bug, then check the input in as a seed
# (docs/development.md, "Fuzzing").
set -euo pipefail
target=$1 seeds=$2 work=$3 seconds=$4
mkdir -p "$work/corpus"
rc=0
# -entropic=0: libFuzzer 14's entropic schedule updates a feature-frequency
# table for every feature an input touches, at a cost that grows with the
# rare-feature list; the compiler targets touch ~30k features per input and
# spent ~70% of their time there (perf, docs/benchmarks.md "Fuzzing"). The
# vanilla schedule runs graph_ingest ~12x, kiln_text ~7x, onnx_import ~2x faster
# and reaches more coverage in the same time; what each target checks is unchanged.
"$target" -entropic=0 -max_total_time="$seconds" -timeout=25 -rss_limit_mb=3072 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" "$seeds" 2>"$work/log" || rc=$?
grep -E '^(stat::|#[0-9]+.*DONE)' "$work/log" || true
if ((rc != 0)); then
  tail -n 80 "$work/log"
  echo "run_fuzz: $(basename "$target") failed (exit $rc); reproduce with: $target $work/<artifact>" >&2
fi
exit "$rc"
