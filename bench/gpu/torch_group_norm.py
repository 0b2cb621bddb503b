#!/usr/bin/env python3
"""The PyTorch peer of group_norm_bench: eager F.group_norm (32 groups, weight
and bias) on the same NCHW CUDA tensors, and a device-to-device copy
(Tensor.copy_) of the same bytes, timed with CUDA events: the median of
`rounds` batches of `reps` calls after warm-up. Bytes moved = x read + y
written. Prints one JSON object shaped like group_norm_bench's ("impl": "torch").

usage: torch_group_norm.py [--dtype bf16] [--reps 20] [--rounds 7]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

SHAPES = [(2, 320, 64, 64), (2, 640, 32, 32), (2, 1280, 16, 16), (1, 512, 128, 128),
          (8, 256, 56, 56)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["f32", "f16", "bf16"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(42)

    def time(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ms = []
        for _ in range(args.rounds):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(args.reps):
                fn()
            e1.record()
            e1.synchronize()
            ms.append(e0.elapsed_time(e1) / args.reps)
        return statistics.median(ms)

    results = []
    for shape in SHAPES:
        x = (0.5 + torch.rand(*shape, device=dev, generator=g) * 4 - 2).to(dtype)
        c = shape[1]
        w = (1 + 0.25 * (torch.rand(c, device=dev, generator=g) * 4 - 2)).to(dtype)
        b = (0.1 * (torch.rand(c, device=dev, generator=g) * 4 - 2)).to(dtype)
        y = torch.empty_like(x)
        moved = 2 * x.numel() * x.element_size()
        copy_ms = time(lambda: y.copy_(x))
        ms = time(lambda: F.group_norm(x, 32, w, b, 1e-5))
        results.append({"shape": list(shape), "groups": 32, "ms": ms, "gbps": moved / ms / 1e6,
                        "copy_ms": copy_ms, "copy_gbps": moved / copy_ms / 1e6,
                        "of_copy": copy_ms / ms, "impl": "torch"})
    print(json.dumps({"bench": "group_norm", "device": "cuda", "name": torch.cuda.get_device_name(),
                      "torch": torch.__version__, "dtype": args.dtype, "results": results}))


if __name__ == "__main__":
    main()
