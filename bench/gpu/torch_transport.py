#!/usr/bin/env python3
"""PyTorch's side of transport_bench (issue 8, res8): the same bytes up to the GPU and
back, x.to('cuda', non_blocking=True) then y.copy_(x_gpu, non_blocking=True) and a
synchronize, from pinned host memory and from pageable memory (y = x_gpu.cpu()),
median wall time of --iters after 2 warm-ups.

usage: torch_transport.py [--mib 3,25,64] [--iters 20]
"""
import argparse
import json
import time

import torch


def median_ms(call, iters):
    for _ in range(2):
        call()
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        t.append((time.perf_counter() - t0) * 1e3)
    t.sort()
    return t[len(t) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", default="3,25,64")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    stream = torch.cuda.current_stream()
    for mib in (int(m) for m in args.mib.split(",")):
        n = mib << 20
        x_pin = torch.ones(n, dtype=torch.uint8).pin_memory()
        y_pin = torch.zeros(n, dtype=torch.uint8).pin_memory()
        x_page = torch.ones(n, dtype=torch.uint8)

        def pinned():
            y_pin.copy_(x_pin.to("cuda", non_blocking=True), non_blocking=True)
            stream.synchronize()

        def pageable():
            return x_page.to("cuda", non_blocking=True).cpu()

        row = {"bench": "worker_transport", "impl": "torch", "mib": mib,
               "pinned_ms": median_ms(pinned, args.iters),
               "pageable_ms": median_ms(pageable, args.iters)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
