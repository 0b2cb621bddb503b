#!/usr/bin/env bash
# Builds what the GPU machine runs (GPU.md): a release build with the Vulkan
# and CUDA backends and the cuBLAS peer, packed with the Debian libraries it loads into
# .gpu/kiln-gpu.tar.xz (glibc, the CUDA libraries and libcuda stay behind: the
# machine has its own), plus Debian's libvulkan1 .deb (the loader; the NVIDIA
# ICD is there). bench/gpu/run.sh (Vulkan) and bench/gpu/cuda.sh (CUDA)
# unpack and run it. The CUDA backend opens libcuda, libnvrtc and
# libcublasLt at run time: none of them travels.
#   scripts/gpu_bundle.sh [BUILD_DIR]
#   KILN_BUNDLE_TARGETS="kiln_cuda_test kiln_conformance_test" scripts/gpu_bundle.sh build
# The device tool carries at most 64 MiB, the checkout (~6 MB) included, and
# every binary links the whole engine (~4 MB each, compressed): the default set
# comes to ~63 MB, too much with the tree. Name only what one call runs in
# KILN_BUNDLE_TARGETS (kiln-device-worker is always added); the script warns
# when the archive leaves too little room.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
# .git is a file in a worktree: ask git where the exclude file is.
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=ON \
  -DKILN_BUILD_BENCH=ON -DKILN_WITH_CUDA=ON >/dev/null
default_targets="kiln_conformance_test kiln_cts_test kiln_vulkan_test kiln_cuda_test kiln_bench
  matmul_vs_cublas bandwidth_vs_copy attention_fwd kiln_engine_test kiln_fault_worker
  kiln_train_bench layers_bf16 host_copy_bench dequant_matvec group_norm_bench"
read -r -a targets <<< "$(echo ${KILN_BUNDLE_TARGETS:-$default_targets}) kiln-device-worker"
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)"
rm -rf .gpu/stage && mkdir -p .gpu/stage/bin .gpu/stage/lib
# The device worker sits beside the binaries that start it (DefaultWorkerBinary).
for t in "${targets[@]}"; do
  bin=$(find "$build" -path "$build/CMakeFiles" -prune -o -type f -name "$t" -perm -u+x -print | head -1)
  [[ -n $bin ]] || { echo "gpu_bundle.sh: no binary $t in $build" >&2; exit 1; }
  cp "$bin" .gpu/stage/bin/
done
strip .gpu/stage/bin/*
# glibc, the C++ runtime and zlib are newer there (and Python's torch needs
# theirs); CUDA and the Vulkan loader come from the machine or the .deb.
skip='^(libc|libm|libpthread|libdl|librt|ld-linux.*|libstdc\+\+|libgcc_s|libz|libcuda|libcublas.*|libcudart|libnvrtc.*|libvulkan)\.so'
for b in .gpu/stage/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | while read -r lib; do
    name=$(basename "$lib")
    [[ $name =~ $skip ]] && continue
    [[ -f .gpu/stage/lib/$name ]] || cp -L "$lib" .gpu/stage/lib/
  done
done
tar -C .gpu/stage -cJf .gpu/kiln-gpu.tar.xz .
rm -rf .gpu/stage  # only the archive travels (64 MiB limit)
# The NVIDIA Vulkan ICD (libGLX_nvidia) needs glvnd beside the loader.
(cd .gpu && rm -f ./*.deb && apt-get download libvulkan1 libglvnd0 libglx0 libegl1 libgl1 libopengl0 \
  libgles2 2>/dev/null >/dev/null)
du -sh .gpu/kiln-gpu.tar.xz .gpu/*.deb
size=$(stat -c %s .gpu/kiln-gpu.tar.xz)
if (( size > 56 * 1024 * 1024 )); then
  echo "gpu_bundle.sh: the archive is $((size >> 20)) MiB; with the checkout it may pass the" \
       "device tool's 64 MiB: set KILN_BUNDLE_TARGETS to what the call runs" >&2
fi
