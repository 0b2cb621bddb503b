#!/usr/bin/env bash
# clang-format over our C++ sources (Google style, 100 columns; see .clang-format).
#   scripts/format.sh          rewrite files in place
#   scripts/format.sh --check  list files that differ and exit 1 (for CI or review)
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v '^build')
if [[ "${1:-}" == "--check" ]]; then
  bad=0
  for f in "${files[@]}"; do
    if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then echo "$f"; bad=1; fi
  done
  exit $bad
fi
clang-format -i "${files[@]}"
