#!/usr/bin/env python3
"""PyTorch eager (CUDA) training step of examples/char_gpt/char_gpt.kiln's model,
as the peer of Kiln's step on cuda:0 (bench/gpu/train_gpt.sh): the params and
the batch that `kiln_train_bench --model gpt --export DIR` wrote, AdamW as
Kiln's default (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 on
every param), fp32 with TF32 off; the same batch every step, as Kiln's bench.
Times each step (forward, backward, optimizer) with CUDA events after warm-up
and prints one JSON line with the median, the ratio to Kiln's median from
DIR/kiln.json, and both loss curves (they should agree to ~1e-4 relative).

usage: torch_train_gpt.py EXPORT_DIR [--steps 50] [--device cuda|cpu]
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples/char_gpt"))
import char_gpt  # noqa: E402
import torch_char_gpt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    d = pathlib.Path(args.export_dir)
    kiln = json.loads((d / "kiln.json").read_text())
    p = {n: torch.tensor(np.load(d / f"{n}.npy"), device=dev, requires_grad=True)
         for n in char_gpt.PARAM_SHAPES}
    x = torch.tensor(np.load(d / "x.npy"), device=dev)
    y = torch.tensor(np.load(d / "y.npy"), device=dev)
    opt = torch.optim.AdamW(p.values(), lr=1e-3, weight_decay=0.01)
    cuda = dev.type == "cuda"
    losses, times = [], []
    for i in range(args.steps + 3):
        t0 = time.perf_counter()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        loss = torch_char_gpt.loss_fn(p, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            e1.record()
            e1.synchronize()
            ms = e0.elapsed_time(e1)
        else:  # the CPU (a check of the script here): wall time
            ms = (time.perf_counter() - t0) * 1e3
        losses.append(float(loss))
        if i >= 3:
            times.append(ms)
    med = statistics.median(times)
    n = min(len(losses), len(kiln["losses"]))
    rel = max(abs(a - b) / abs(b) for a, b in zip(kiln["losses"][:n], losses[:n]))
    print(json.dumps({
        "bench": "train_step_char_gpt", "peer": f"torch {torch.__version__} eager",
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "batch": int(x.shape[0]), "steps": args.steps,
        "torch_median_ms": med, "kiln_median_ms": kiln["median_ms"],
        "kiln_over_torch": kiln["median_ms"] / med if med else None,
        "max_rel_loss_diff": rel, "kiln_losses": kiln["losses"][:5], "torch_losses": losses[:5]}))


if __name__ == "__main__":
    main()
