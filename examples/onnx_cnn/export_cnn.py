#!/usr/bin/python3
"""Exports a small CNN (two conv + BatchNorm + ReLU stages, max-pool, a linear
head; randomly initialised: nothing downloads here) from PyTorch to ONNX, as a
version directory of Kiln's model repository:

    <out>/model.onnx     the model (opset 13, dynamic batch)
    <out>/x.npy          an input batch [4, 3, 32, 32]
    <out>/expected.npy   PyTorch's logits for it

Then, for example (examples/onnx_cnn/README.md):

    kilnctl run <out>/model.onnx -i x=<out>/x.npy -o /tmp/out     # ONNX wherever a graph goes
    kilnd --model_repository=<repo>                               # with <out> = <repo>/cnn/1
    kilnctl run --model cnn -i x=<out>/x.npy

Needs Debian's python3-torch and python3-onnx; run it with /usr/bin/python3.
"""
import argparse
import os

import numpy as np
import torch
from torch import nn


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2))
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the version directory to write")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    model = Cnn().eval()
    for m in model.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    x = torch.randn(4, 3, 32, 32, generator=gen)
    os.makedirs(args.out, exist_ok=True)
    with torch.no_grad():
        expected = model(x)
        torch.onnx.export(model, x, os.path.join(args.out, "model.onnx"), opset_version=13,
                          input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    np.save(os.path.join(args.out, "x.npy"), x.numpy())
    np.save(os.path.join(args.out, "expected.npy"), expected.numpy())
    print(f"wrote {args.out}/model.onnx, x.npy, expected.npy")


if __name__ == "__main__":
    main()
