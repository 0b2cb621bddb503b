#!/usr/bin/python3
"""MLP 784-512-512-10 (fp32, batch 1 and 64): Kiln in-process vs ONNX Runtime vs
oneDNN's own matmul primitives, same weights, 2 threads each, alternating rounds in
one run; prints JSON with the medians and the ratios, and checks that the outputs
agree with the f64 reference.

Kiln and oneDNN run inside `kiln_bench mlp` (interleaved there, A B A B); ONNX
Runtime (npm onnxruntime-node, bench/ort) runs in a Node child process, its rounds
alternating with kiln_bench's.

usage: bench/mlp_vs_ort.py BUILD_DIR [--rounds 7] [--iters 300] [--threads 2] [--batches 1,64]
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
from onnx import TensorProto, helper, numpy_helper

from encoder_vs_ort import ensure_ort, run_json


def build_onnx(export_dir):
    with open(os.path.join(export_dir, "manifest.json")) as f:
        manifest = json.load(f)
    t = {e["name"]: np.fromfile(os.path.join(export_dir, e["name"] + ".bin"), dtype=np.float32)
         .reshape(e["dims"]) for e in manifest["tensors"]}
    inits = [numpy_helper.from_array(t[n], n) for n in ["w1", "b1", "w2", "b2", "w3", "b3"]]
    nodes = []
    h = "x"
    for i in (1, 2, 3):
        nodes.append(helper.make_node("MatMul", [h, f"w{i}"], [f"mm{i}"]))
        out = f"fc{i}" if i < 3 else "logits"
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [out]))
        h = out
        if i < 3:
            nodes.append(helper.make_node("Relu", [h], [f"relu{i}"]))
            h = f"relu{i}"
    batch = manifest["batch"]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 784])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = os.path.join(export_dir, "mlp.onnx")
    onnx.save(model, path)
    with open(os.path.join(export_dir, "inputs.json"), "w") as fh:
        json.dump([{"name": "x", "dims": [batch, 784], "file": os.path.join(export_dir, "x.bin")}],
                  fh)
    return path, t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,64")
    args = ap.parse_args()
    bench = os.path.join(args.build_dir, "bench", "engine", "kiln_bench")
    ort_dir = ensure_ort()
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456"
    batches = [int(b) for b in args.batches.split(",")]
    results = []
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        run_json([bench, "mlp", "--batches", args.batches, "--rounds", "1", "--iters", "3",
                  "--threads", str(args.threads), "--export", tmp], env)
        models = {b: build_onnx(os.path.join(tmp, f"b{b}")) for b in batches}
        kiln = {b: [] for b in batches}
        dnnl = {b: [] for b in batches}
        ortr = {b: [] for b in batches}
        steps = {}
        max_diff = {}
        for r in range(args.rounds):
            out = run_json([bench, "mlp", "--batches", args.batches, "--rounds", "1", "--iters",
                            str(args.iters), "--threads", str(args.threads)], env)
            for res in out["results"]:
                kiln[res["batch"]].append(res["kiln_us"] / 1000)
                dnnl[res["batch"]].append(res["onednn_us"] / 1000)
                steps[res["batch"]] = {"kiln": res["kiln_steps"], "onednn": res["onednn_layers"]}
            for b in batches:
                model, _ = models[b]
                d = os.path.join(tmp, f"b{b}")
                cmd = ["node", os.path.join(ort_dir, "ort_run.js"), model,
                       os.path.join(d, "inputs.json"), "--iters", str(args.iters), "--warmup",
                       "20", "--threads", str(args.threads)]
                if r == 0:
                    cmd += ["--out", os.path.join(d, "y_ort.bin")]
                ortr[b].append(run_json(cmd, env)["p50_ms"])
        for b in batches:
            _, t = models[b]
            y_ort = np.fromfile(os.path.join(tmp, f"b{b}", "y_ort.bin"), dtype=np.float32)
            max_diff[b] = float(np.max(np.abs(y_ort - t["y_ref"].reshape(-1))))
            ok = ok and max_diff[b] < 1e-4
            k, o, d = statistics.median(kiln[b]), statistics.median(ortr[b]), statistics.median(dnnl[b])
            results.append({
                "batch": b, "kiln_p50_ms": k, "ort_p50_ms": o, "onednn_p50_ms": d,
                "kiln_over_ort": k / o, "kiln_over_onednn": k / d,
                "kiln_p50_ms_rounds": kiln[b], "ort_p50_ms_rounds": ortr[b],
                "onednn_p50_ms_rounds": dnnl[b], "ort_max_abs_diff_vs_f64": max_diff[b],
                "per_layer_us": steps[b],
            })
    print(json.dumps({"bench": "mlp_784_512_512_10_vs_onnxruntime", "threads": args.threads,
                      "rounds": args.rounds, "iters_per_round": args.iters, "results": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
