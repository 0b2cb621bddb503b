#!/usr/bin/env python3
"""PyTorch eager (CUDA, bf16) on the layers layers_bf16 exported: the BERT-base
encoder layer (post-LN, GELU erf) or the 7B-style decoder layer (pre-norm RmsNorm,
causal SDPA, GELU erf MLP, no biases), with Kiln's weights and input; CUDA events
after warm-up, median of timed batches; max |y - Kiln's y| beside it.

With --e2e (res8) it also times, per call on the wall clock (median of --iters calls
after warm-up), what a blocking call costs: the layer on tensors already on the GPU
followed by a synchronize ("eager_sync_ms", Kiln's --io resident counterpart), and end
to end from host memory, x uploaded with x.to('cuda', non_blocking=True) and y brought
back, from pageable memory (y.cpu(), a fresh tensor each call: "e2e_pageable_ms") and
from pinned memory (y copied into one pinned tensor, non_blocking, then a synchronize:
"e2e_pinned_ms"), Kiln's --io host counterparts.

usage: torch_layers.py EXPORT_DIR [--iters 20] [--e2e] [--tf32]
"""
import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--e2e", action="store_true")
    ap.add_argument("--tf32", action="store_true",
                    help="torch.backends.cuda.matmul.allow_tf32 (and cudnn's) on")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    with open(os.path.join(args.export_dir, "manifest.json")) as f:
        manifest = json.load(f)
    cfg = manifest["config"]
    dt = torch.float32 if cfg.get("dtype") == "f32" else torch.bfloat16
    dev = torch.device("cuda")
    t = {e["name"]: torch.from_numpy(
        np.fromfile(os.path.join(args.export_dir, e["name"] + ".bin"), dtype=np.float32)
        .reshape(e["dims"])).to(dev).to(dt) for e in manifest["tensors"]}
    h, nh, eps = cfg["hidden"], cfg["heads"], cfg["epsilon"]
    dh = h // nh
    bert = cfg["layer"] == "bert"

    def heads(y, b, s):
        return y.view(b, s, nh, dh).transpose(1, 2)

    def merge(a, b, s):
        return a.transpose(1, 2).reshape(b, s, h)

    def bert_layer(x):
        b, s, _ = x.shape
        q = heads(x @ t["wq"] + t["bq"], b, s)
        k = heads(x @ t["wk"] + t["bk"], b, s)
        v = heads(x @ t["wv"] + t["bv"], b, s)
        a = merge(F.scaled_dot_product_attention(q, k, v), b, s)
        h1 = F.layer_norm(a @ t["wo"] + t["bo"] + x, (h,), t["ln1_g"], t["ln1_b"], eps)
        f = F.gelu(h1 @ t["w1"] + t["b1"])
        return F.layer_norm(f @ t["w2"] + t["b2"] + h1, (h,), t["ln2_g"], t["ln2_b"], eps)

    def rms(x, g):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * g

    def decoder_layer(x):
        b, s, _ = x.shape
        n1 = rms(x, t["norm1"])
        q, k, v = (heads(n1 @ t[w], b, s) for w in ("wq", "wk", "wv"))
        h1 = x + merge(F.scaled_dot_product_attention(q, k, v, is_causal=True), b, s) @ t["wo"]
        return h1 + F.gelu(rms(h1, t["norm2"]) @ t["w1"]) @ t["w2"]

    layer = bert_layer if bert else decoder_layer
    x = t["x"]
    with torch.no_grad():
        for _ in range(3):
            y = layer(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(args.iters):
                layer(x)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / args.iters)
    times.sort()
    diff = (y.float() - t["y_kiln"].float()).abs()
    row = {"bench": "layer_bf16", "impl": "torch_eager", "layer": cfg["layer"],
           "dtype": cfg.get("dtype", "bf16"), "batch": cfg["batch"], "seq": cfg["seq"],
           "eager_ms": times[len(times) // 2], "torch": torch.__version__, "tf32": args.tf32,
           "max_abs_diff_vs_kiln": diff.max().item(),
           "mean_abs_diff_vs_kiln": diff.mean().item()}
    if args.e2e:
        row.update(end_to_end(layer, x, args.iters))
    print(json.dumps(row), flush=True)


def wall_median(call, iters):
    """Median wall time of `call` (which blocks until its result is ready), ms."""
    for _ in range(3):
        call()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def end_to_end(layer, x_dev, iters):
    x_pageable = x_dev.cpu()
    x_pinned = x_dev.cpu().pin_memory()
    y_pinned = torch.empty_like(x_pinned).pin_memory()
    stream = torch.cuda.current_stream()

    def resident():
        layer(x_dev)
        stream.synchronize()

    def pageable():
        return layer(x_pageable.to("cuda", non_blocking=True)).cpu()

    def pinned():
        y_pinned.copy_(layer(x_pinned.to("cuda", non_blocking=True)), non_blocking=True)
        stream.synchronize()

    with torch.no_grad():
        out = {"eager_sync_ms": wall_median(resident, iters),
               "e2e_pageable_ms": wall_median(pageable, iters),
               "e2e_pinned_ms": wall_median(pinned, iters)}
        # The end-to-end paths compute what the resident one does.
        ref = layer(x_dev).cpu()
        pinned()
        out["e2e_max_abs_diff"] = max((pageable() - ref).abs().max().item(),
                                      (y_pinned - ref).abs().max().item())
    return out


if __name__ == "__main__":
    main()
