#!/usr/bin/env bash
# On the GPU machine (device tool, carry the bundle of scripts/gpu_bundle.sh):
# the char-GPT training step (examples/char_gpt/char_gpt.kiln: 2 layers, d 64,
# 4 heads, seq 64, AdamW) on cuda:0 in process (kiln_train_bench) beside
# PyTorch 2.11 eager on the same GPU with the same params and batch
# (torch_train_gpt.py), at batch 32 and 256, alternating Kiln and PyTorch
# three times. Prints one JSON line per pair (medians, ratio, loss agreement);
# copies them to $OUT/train_gpt.json.
#   KILN_GPU_BUNDLE=.gpu bash bench/gpu/train_gpt.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/unpack.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in 1 2 3; do
  for batch in 32 256; do
    dir=/tmp/train_gpt_b$batch
    timeout 300 "$stage/bin/kiln_train_bench" --model gpt --graph "$root/examples/char_gpt/char_gpt.kiln" \
      --device cuda:0 --batch "$batch" --steps 50 --threads 16 --export "$dir" \
      > /dev/null 2>> "$out/train_gpt.log" || { echo "kiln_train_bench failed (batch $batch):"; tail -5 "$out/train_gpt.log"; continue; }
    LD_LIBRARY_PATH= timeout 300 python3 "$here/torch_train_gpt.py" "$dir" --steps 50 \
      2>> "$out/train_gpt.log" | tee -a "$out/train_gpt.json"
  done
done
