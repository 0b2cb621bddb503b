#!/usr/bin/env bash
# clang-tidy over the files given (or every engine/backend/server/client
# source), using the build's compile_commands.json.
#   scripts/lint.sh [BUILD_DIR] [files...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
if [[ ! -f "$build/compile_commands.json" ]]; then
  echo "lint: $build/compile_commands.json missing; run make build first" >&2
  exit 2
fi
if (($# == 0)); then
  mapfile -t files < <(git ls-files 'engine/*.cc' 'backends/*.cc' 'server/*.cc' 'clients/*.cc')
else
  files=("$@")
fi
clang-tidy -p "$build" --quiet "${files[@]}"
