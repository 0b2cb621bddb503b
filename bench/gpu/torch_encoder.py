#!/usr/bin/env python3
"""PyTorch eager (CUDA) BERT-base encoder layer with the weights kiln_bench
exported, as the peer for Kiln on the GPU: fp32 (TF32 off), timing with CUDA
events after warm-up; checks the output against Kiln's exported output.

usage: torch_encoder.py EXPORT_DIR [--iters 50] [--batch B]
"""
import argparse
import json
import os

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(os.path.join(args.export_dir, "manifest.json")) as f:
        manifest = json.load(f)
    cfg = manifest["config"]
    dev = torch.device("cuda")
    t = {e["name"]: torch.from_numpy(
        np.fromfile(os.path.join(args.export_dir, e["name"] + ".bin"), dtype=np.float32)
        .reshape(e["dims"])).to(dev) for e in manifest["tensors"]}
    h, nh, eps = cfg["hidden"], cfg["heads"], cfg["epsilon"]
    dh = h // nh

    def layer(x):
        b, s, _ = x.shape

        def heads(y):
            return y.view(b, s, nh, dh).transpose(1, 2)

        q = heads(x @ t["wq"] + t["bq"])
        k = heads(x @ t["wk"] + t["bk"])
        v = heads(x @ t["wv"] + t["bv"])
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        a = a.transpose(1, 2).reshape(b, s, h)
        h1 = torch.nn.functional.layer_norm(a @ t["wo"] + t["bo"] + x, (h,), t["ln1_g"], t["ln1_b"], eps)
        f = torch.nn.functional.gelu(h1 @ t["w1"] + t["b1"])
        return torch.nn.functional.layer_norm(f @ t["w2"] + t["b2"] + h1, (h,), t["ln2_g"], t["ln2_b"], eps)

    x = t["x"]
    with torch.no_grad():
        for _ in range(10):
            y = layer(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            y = layer(x)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
    times.sort()
    out = {"impl": "pytorch-eager-cuda", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "batch": int(x.shape[0]), "seq": int(x.shape[1]), "p50_ms": times[len(times) // 2],
           "min_ms": times[0]}
    if "y_kiln" in t:
        out["max_abs_diff_vs_kiln"] = float((y - t["y_kiln"]).abs().max())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
