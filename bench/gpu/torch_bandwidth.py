#!/usr/bin/env python3
"""The PyTorch peer of bandwidth_vs_copy: eager LayerNorm (weight, bias),
RmsNorm (weight) and GELU (erf) on a rows x cols CUDA tensor, and a
device-to-device copy (Tensor.copy_) of the same bytes, timed with CUDA
events: the median of `rounds` batches of `reps` calls after warm-up.
Bytes moved = the tensor read + the result written (+ weight and bias).
Prints one JSON object shaped like bandwidth_vs_copy's ("impl": "torch").

usage: torch_bandwidth.py [--rows 8192] [--cols 8192] [--dtype bf16] [--reps 20] [--rounds 7]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--dtype", default="bf16", choices=["f32", "f16", "bf16"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(42)
    x = (torch.rand(args.rows, args.cols, device=dev, generator=g) * 4 - 2).to(dtype)
    w = (1 + 0.25 * (torch.rand(args.cols, device=dev, generator=g) * 4 - 2)).to(dtype)
    b = (0.1 * (torch.rand(args.cols, device=dev, generator=g) * 4 - 2)).to(dtype)
    y = torch.empty_like(x)
    size = x.element_size()
    n = x.numel()

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

    copy_ms = time(lambda: y.copy_(x))
    copy_gbps = 2 * n * size / copy_ms / 1e6
    cases = [
        ("layer_norm", lambda: F.layer_norm(x, (args.cols,), w, b, 1e-5), 2),
        ("rms_norm", lambda: F.rms_norm(x, (args.cols,), w, 1e-6), 1),
        ("gelu", lambda: F.gelu(x), 0),
    ]
    results = []
    for name, fn, params in cases:
        ms = time(fn)
        moved = 2 * n * size + params * args.cols * size
        gbps = moved / ms / 1e6
        results.append({"op": name, "ms": ms, "gbps": gbps, "of_copy": gbps / copy_gbps})
    print(json.dumps({"bench": "bandwidth_vs_copy", "impl": "torch", "torch": torch.__version__,
                      "name": torch.cuda.get_device_name(), "rows": args.rows, "cols": args.cols,
                      "dtype": args.dtype, "copy_ms": copy_ms, "copy_gbps": copy_gbps,
                      "results": results}))


if __name__ == "__main__":
    main()
