# Sourced by the GPU machine's scripts (run.sh, isolation.sh): unpacks the
# bundle made by scripts/gpu_bundle.sh into $stage, installs the Vulkan loader
# .debs, points the loader at the NVIDIA ICD, and sets $out (default /tmp/out).
# The bundle folder is $KILN_GPU_BUNDLE (default .gpu): a helper working in
# another worktree carries its bundle in a folder of its own (the device tool
# sends the session's checkout, docs/cuda.md).
bundle=${KILN_GPU_BUNDLE:-.gpu}
stage=/tmp/kiln-gpu
mkdir -p "$stage" && tar -xJf "$bundle/kiln-gpu.tar.xz" -C "$stage"
for f in "$bundle"/*.deb; do dpkg -x "$f" /; done
ldconfig
# The NVIDIA ICD manifest is not always where the loader looks by default.
for icd in /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json \
           /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json \
           $(find / -xdev -name 'nvidia_icd*.json' 2>/dev/null | head -1); do
  if [[ -f $icd ]]; then export VK_DRIVER_FILES=$icd; break; fi
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$stage/lib
out=${OUT:-/tmp/out}
mkdir -p "$out"
