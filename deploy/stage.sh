#!/usr/bin/env bash
# Builds what the runtime image ships and lays it out under STAGE_DIR, exactly
# as the Dockerfile's runtime stage copies it:
#
#   STAGE_DIR/bin/kilnd, bin/kilnctl        the daemon and its command-line client
#   STAGE_DIR/bin/kiln-device-worker        kilnd's device worker process (when the tree has it)
#   STAGE_DIR/bin/kiln-init-secrets         deploy/init-secrets.sh (compose's kiln-init)
#   STAGE_DIR/wheels/kiln-*.whl             the Python client (pip install it)
#   STAGE_DIR/etc/kiln/                     configs/ and deploy/container.textproto
#   STAGE_DIR/runtime-packages.txt          the Debian packages whose shared
#                                           libraries the two binaries load
#
#   deploy/stage.sh BUILD_DIR STAGE_DIR
#
# The Dockerfile's build stage runs it after scripts/install-deps.sh; the
# deploy tests run it against the test build to check the image's contents
# without a Docker engine. BUILD_DIR is configured (Release) when it has no
# build.ninja yet; only the targets the image needs are built.
set -euo pipefail

if (($# != 2)); then
  echo "usage: $0 BUILD_DIR STAGE_DIR" >&2
  exit 2
fi
src=$(cd "$(dirname "$0")/.." && pwd)
build=$1
stage=$2

if [[ ! -f $build/build.ninja ]]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=OFF
fi
# kilnd runs devices other than the CPU in kiln-device-worker child processes,
# which it looks for beside itself (engine/runtime/worker_client.h).
targets=(kilnd kilnctl)
# (grep reads all of cmake's output: with -q it would stop at the match, cmake
# would die of SIGPIPE, and under pipefail the test would read as false.)
if cmake --build "$build" --target help | grep '^kiln-device-worker:' >/dev/null; then
  targets+=(kiln-device-worker)
fi
cmake --build "$build" --target "${targets[@]}"

mkdir -p "$stage/bin" "$stage/wheels" "$stage/etc/kiln"
install -m 0755 "$build/server/kilnd" "$build/clients/kilnctl" "$stage/bin/"
if [[ " ${targets[*]} " == *" kiln-device-worker "* ]]; then
  install -m 0755 "$build/backends/kiln-device-worker" "$stage/bin/"
fi
install -m 0755 "$src/deploy/init-secrets.sh" "$stage/bin/kiln-init-secrets"
cp "$src"/configs/*.textproto "$src/deploy/container.textproto" "$stage/etc/kiln/"

# The wheel is built from a copy, so the source tree stays clean; its stubs
# come from proto/ (setup.py, KILN_PROTO_DIR). Debian's setuptools and pip,
# no index: this works offline.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/clients/python" "$tmp/python"
rm -rf "$tmp/python/build" "$tmp"/python/*.egg-info
KILN_PROTO_DIR="$src/proto" /usr/bin/python3 -m pip wheel --no-deps --no-build-isolation \
  --no-index --disable-pip-version-check -q -w "$stage/wheels" "$tmp/python"

# The packages that own every shared library the binaries load, so the slim
# image installs exactly those (and nothing of the build toolchain).
# (Debian 12 merges /lib into /usr/lib; dpkg may know a library by either path.)
owner() {
  dpkg -S "$1" 2>/dev/null || dpkg -S "${1#/usr}" 2>/dev/null || {
    echo "stage: no Debian package owns $1" >&2
    return 1
  }
}
binaries=("$stage/bin/kilnd" "$stage/bin/kilnctl")
if [[ -x $stage/bin/kiln-device-worker ]]; then binaries+=("$stage/bin/kiln-device-worker"); fi
ldd "${binaries[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  sort -u | while read -r lib; do owner "$(realpath "$lib")" || exit 1; done | cut -d: -f1 | sort -u \
  >"$stage/runtime-packages.txt"
echo "stage: $(wc -l <"$stage/runtime-packages.txt") runtime packages, $(ls "$stage/wheels")"
