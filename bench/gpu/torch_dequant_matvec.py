#!/usr/bin/env python3
"""The PyTorch peer of dequant_matvec: what a PyTorch user runs for a GGUF
layer without a fused dequant kernel, a bf16 matvec (M = 1) or small batch
(M = 8 .. 512, prefill) against the dequantized weight, F.linear(x, W) with W bf16 [N, K],
plus a device-to-device copy (Tensor.copy_, 256 MiB) for its own copy
bandwidth. CUDA events: the median of `rounds` batches of `reps` calls after
warm-up. GB/s counts the bf16 weight bytes (2 N K). Prints one JSON object.

usage: torch_dequant_matvec.py [--shapes 4096x4096,14336x4096,4096x14336] [--ms 1,8,16,32,64,128,512]
                               [--reps 50] [--rounds 7]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,14336x4096,4096x14336")
    ap.add_argument("--ms", default="1,8,16,32,64,128,512")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(42)

    def time(fn, reps):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ms = []
        for _ in range(args.rounds):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(reps):
                fn()
            e1.record()
            e1.synchronize()
            ms.append(e0.elapsed_time(e1) / reps)
        return statistics.median(ms)

    copy_bytes = 256 << 20
    a = torch.ones(copy_bytes, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy_ms = time(lambda: b.copy_(a), 10)
    copy_gbps = 2 * copy_bytes / copy_ms / 1e6
    del a, b
    results = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = (torch.rand(n, k, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        for m in (int(v) for v in args.ms.split(",")):
            x = (torch.rand(m, k, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
            ms = time(lambda: F.linear(x, w), args.reps)
            gbps = 2 * n * k / ms / 1e6
            results.append({"n": n, "k": k, "m": m, "ms": ms, "gbps": gbps,
                            "of_copy": gbps / copy_gbps, "impl": "torch bf16 F.linear"})
        del w
    print(json.dumps({"bench": "torch_dequant_matvec", "torch": torch.__version__,
                      "name": torch.cuda.get_device_name(), "copy_ms": copy_ms,
                      "copy_gbps": copy_gbps, "results": results}))


if __name__ == "__main__":
    main()
