#!/usr/bin/python3
"""ONNX models exported from PyTorch, imported by Kiln and run on the CPU, vs
ONNX Runtime 1.30 (npm onnxruntime-node) on the same file, both with 2 threads,
alternating Kiln / ORT round by round; prints one JSON line per model with the
medians, their ratio and the largest output difference from PyTorch.

    bench/onnx_cnn_vs_ort.py BUILD_DIR [--rounds 5] [--iters 40] [--batch 8]
        [--model cnn|encoder|encoder17|encoder_loop|all] [--report] [--baseline BUILD_DIR]
        [--no-patterns-too]

--model picks the export (default cnn, the figures of docs/benchmarks.md):
  encoder       nn.TransformerEncoderLayer at BERT-base size (768 wide, 12
                heads, FFN 3072, GELU, post-norm), [1, 128, 768], traced at
                opset 13: LayerNorm and GELU decomposed (ReduceMean, Sub, Pow,
                Sqrt, Div; Erf, Mul, Add), attention as MatMul/Softmax/MatMul;
  encoder17     the same at opset 17 (LayerNormalization kept);
  encoder_loop  the layer applied twice by a scripted for loop (ONNX Loop of
                trip count 2 around the traced layer).
--report prints Kiln's per-kernel times (one reported run) to stderr.

The CNN: conv3x3(3->32)+BN+ReLU, conv3x3/2(32->64)+BN+ReLU,
conv3x3/2(64->128)+BN+ReLU, global average pool, linear(128->10), on
[batch, 3, 64, 64]. BatchNormalization stays in the file (TrainingMode.PRESERVE
of an eval model) so both runtimes see the same graph.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from encoder_vs_ort import ensure_ort, run_json  # noqa: E402


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        layers, c = [], 3
        for out, stride in ((32, 1), (64, 2), (128, 2)):
            layers += [nn.Conv2d(c, out, 3, stride=stride, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
            c = out
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.body(x), 1), 1))


def encoder_layer():
    return nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu",
                                      batch_first=True).eval()


class EncoderLoop(nn.Module):
    def __init__(self, layer, depth: int):
        super().__init__()
        self.layer = layer
        self.depth = depth

    def forward(self, x):
        for _ in range(self.depth):
            x = self.layer(x)
        return x


def write_input(tmp, xn):
    with open(os.path.join(tmp, "x.pb"), "wb") as f:
        f.write(numpy_helper.from_array(xn, "x").SerializeToString())
    xn.tofile(os.path.join(tmp, "x.bin"))
    with open(os.path.join(tmp, "inputs.json"), "w") as f:
        json.dump([{"name": "x", "dims": list(xn.shape), "file": os.path.join(tmp, "x.bin")}], f)


def export_encoder(tmp, which):
    """Exported with autograd on: under no_grad an eval TransformerEncoderLayer
    takes its fused fast path, which has no ONNX export."""
    torch.manual_seed(0)
    layer = encoder_layer()
    x = torch.randn(1, 128, 768)
    path = os.path.join(tmp, which + ".onnx")
    if which == "encoder_loop":
        traced = torch.jit.trace(layer, (x,), check_trace=False)
        model = torch.jit.script(EncoderLoop(traced, 2))
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], opset_version=13)
        with torch.no_grad():
            y = layer(layer(x))
    else:
        torch.onnx.export(layer, x, path, input_names=["x"], output_names=["y"],
                          opset_version=17 if which == "encoder17" else 13)
        with torch.no_grad():
            y = layer(x)
    onnx.checker.check_model(onnx.load(path))
    write_input(tmp, x.numpy().astype(np.float32))
    return path, y.numpy(), list(x.shape)


def export(tmp, batch):
    torch.manual_seed(0)
    m = Cnn().eval()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    x = torch.randn(batch, 3, 64, 64)
    path = os.path.join(tmp, "cnn.onnx")
    torch.onnx.export(m, x, path, input_names=["x"], output_names=["y"], opset_version=13,
                      training=torch.onnx.TrainingMode.PRESERVE)
    onnx.checker.check_model(onnx.load(path))
    write_input(tmp, x.numpy().astype(np.float32))
    with torch.no_grad():
        return path, m(x).numpy(), list(x.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--model", default="cnn",
                    choices=["cnn", "encoder", "encoder17", "encoder_loop", "all"])
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--no-patterns-too", action="store_true",
                    help="also run Kiln importing without the LayerNorm / GELU patterns "
                         "(kiln_onnx_bench --no-patterns) each round")
    ap.add_argument("--baseline", metavar="BUILD_DIR",
                    help="also run this build's kiln_onnx_bench each round (e.g. main's), "
                         "interleaved with the others")
    args = ap.parse_args()
    models = ["cnn", "encoder", "encoder17", "encoder_loop"] if args.model == "all" else [args.model]
    for which in models:
        run_model(args, which)


def run_model(args, which):
    bench = os.path.join(args.build_dir, "bench", "engine", "kiln_onnx_bench")
    ort_dir = ensure_ort()
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456"
    with tempfile.TemporaryDirectory() as tmp:
        if which == "cnn":
            model, y_torch, shape = export(tmp, args.batch)
        else:
            model, y_torch, shape = export_encoder(tmp, which)
        kiln_out, ort_out = os.path.join(tmp, "y_kiln.bin"), os.path.join(tmp, "y_ort.bin")
        kiln, ortr, base, nopat = [], [], [], []
        for r in range(args.rounds):
            if args.no_patterns_too:
                cmd = [bench, model, os.path.join(tmp, "x.pb"), "--iters", str(args.iters),
                       "--threads", str(args.threads), "--no-patterns"]
                nopat.append(run_json(cmd, env)["p50_ms"])
            if args.baseline:
                cmd = [os.path.join(args.baseline, "bench", "engine", "kiln_onnx_bench"), model,
                       os.path.join(tmp, "x.pb"), "--iters", str(args.iters), "--threads",
                       str(args.threads)]
                base.append(run_json(cmd, env)["p50_ms"])
            cmd = [bench, model, os.path.join(tmp, "x.pb"), "--iters", str(args.iters),
                   "--threads", str(args.threads)]
            if r == 0:
                cmd += ["--out", kiln_out]
            if r == 0 and args.report:
                cmd += ["--report"]
                proc = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
                sys.stderr.write(f"kiln per-kernel times, {which}:\n" + proc.stderr)
                kiln.append(json.loads(proc.stdout.strip().splitlines()[-1])["p50_ms"])
            else:
                kiln.append(run_json(cmd, env)["p50_ms"])
            cmd = ["node", os.path.join(ort_dir, "ort_run.js"), model,
                   os.path.join(tmp, "inputs.json"), "--iters", str(args.iters), "--threads",
                   str(args.threads)]
            ortr.append(run_json(cmd + (["--out", ort_out] if r == 0 else []), env)["p50_ms"])
        y_kiln = np.fromfile(kiln_out, dtype=np.float32)
        y_ort = np.fromfile(ort_out, dtype=np.float32)
    k, o = statistics.median(kiln), statistics.median(ortr)
    extra = {}
    if base:
        extra = {"baseline_p50_ms_rounds": base, "baseline_p50_ms": statistics.median(base),
                 "baseline_over_ort": statistics.median(base) / o}
    if nopat:
        extra.update({"no_patterns_p50_ms_rounds": nopat, "no_patterns_p50_ms": statistics.median(nopat),
                      "no_patterns_over_ort": statistics.median(nopat) / o})
    print(json.dumps({
        "bench": f"onnx_{which}_fp32_vs_onnxruntime", "threads": args.threads,
        "input": shape, "rounds": args.rounds, "iters_per_round": args.iters,
        "kiln_p50_ms_rounds": kiln, "ort_p50_ms_rounds": ortr,
        "kiln_p50_ms": k, "ort_p50_ms": o, "kiln_over_ort": k / o,
        "max_abs_diff_kiln_torch": float(np.max(np.abs(y_kiln - y_torch.reshape(-1)))),
        "max_abs_diff_ort_torch": float(np.max(np.abs(y_ort - y_torch.reshape(-1)))),
        **extra,
    }), flush=True)


if __name__ == "__main__":
    main()
