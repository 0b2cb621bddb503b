#!/usr/bin/python3
"""BERT-base encoder layer (fp32, seq 128, batch 1), or a stack of them (--layers 12:
the whole encoder), Kiln in-process vs ONNX Runtime, same weights, 2 threads each,
alternating rounds in one run; prints JSON with the medians and the ratio, and checks
that both compute the same output. --ort_no_spin adds ONNX Runtime with its intra-op
threads' spinning off (its session option session.intra_op.allow_spinning = 0), which
is its better setting on a loaded host.

--baseline BENCH adds a second kiln_bench binary (another build's, e.g. main's copied
aside) to every round, so a change is timed before and after beside ONNX Runtime in
one run. --profile ends with where each side's time goes: Kiln's per-kernel medians
(kiln_bench encoder --kernels) and ONNX Runtime's per-node medians from its own
profiler (SessionOptions.enable_profiling), one run of each.

usage: bench/encoder_vs_ort.py BUILD_DIR [--rounds 5] [--iters 40] [--threads 2]
                               [--layers 1] [--ort_no_spin] [--baseline BENCH] [--profile]
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

HERE = os.path.dirname(os.path.abspath(__file__))


def build_onnx(export_dir):
    with open(os.path.join(export_dir, "manifest.json")) as f:
        manifest = json.load(f)
    cfg = manifest["config"]
    t = {e["name"]: np.fromfile(os.path.join(export_dir, e["name"] + ".bin"), dtype=np.float32)
         .reshape(e["dims"]) for e in manifest["tensors"]}
    s, h, nh = cfg["seq"], cfg["hidden"], cfg["heads"]
    layers = cfg.get("layers", 1)
    dh = h // nh
    inits = []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    init("heads_shape", np.array([0, s, nh, dh], dtype=np.int64))
    init("merge_shape", np.array([0, s, h], dtype=np.int64))
    init("scale", np.array(1.0 / np.sqrt(dh), dtype=np.float32))
    init("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    init("one", np.array(1.0, dtype=np.float32))
    init("half", np.array(0.5, dtype=np.float32))
    n = []

    def node(op, ins, out, **kw):
        n.append(helper.make_node(op, ins, [out], **kw))
        return out

    def layer(x, p, y):
        # Kiln's params of layer i are named "l<i>_wq" (kiln_bench --layers).
        for name in ["wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln1_g", "ln1_b",
                     "w1", "b1", "w2", "b2", "ln2_g", "ln2_b"]:
            init(p + name, t[p + name])

        def proj(x, w, b, name):
            return node("Add", [node("MatMul", [x, p + w], p + name + "_mm"), p + b], p + name)

        def heads(x, name, perm):
            return node("Transpose", [node("Reshape", [x, "heads_shape"], p + name + "_r")],
                        p + name, perm=perm)

        q = heads(proj(x, "wq", "bq", "q"), "qh", [0, 2, 1, 3])
        k = heads(proj(x, "wk", "bk", "k"), "kh", [0, 2, 3, 1])
        v = heads(proj(x, "wv", "bv", "v"), "vh", [0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [q, k], p + "qk"), "scale"], p + "scores")
        probs = node("Softmax", [scores], p + "probs", axis=-1)
        ctx = node("MatMul", [probs, v], p + "ctx")
        merged = node("Reshape", [node("Transpose", [ctx], p + "ctx_t", perm=[0, 2, 1, 3]),
                                  "merge_shape"], p + "merged")
        o = node("Add", [proj(merged, "wo", "bo", "o"), x], p + "o_res")
        h1 = node("LayerNormalization", [o, p + "ln1_g", p + "ln1_b"], p + "h1", axis=-1,
                  epsilon=cfg["epsilon"])
        f = proj(h1, "w1", "b1", "f")
        # gelu(f) = 0.5 f (1 + erf(f / sqrt 2)): the pattern ORT fuses into Gelu.
        erf = node("Erf", [node("Div", [f, "sqrt2"], p + "f_div")], p + "f_erf")
        g = node("Mul", [node("Mul", [f, node("Add", [erf, "one"], p + "f_1p")], p + "f_mul"),
                         "half"], p + "g")
        f2 = node("Add", [proj(g, "w2", "b2", "f2"), h1], p + "f2_res")
        return node("LayerNormalization", [f2, p + "ln2_g", p + "ln2_b"], y, axis=-1,
                    epsilon=cfg["epsilon"])

    x = "x"
    for i in range(layers):
        p = "" if layers == 1 else f"l{i}_"
        x = layer(x, p, "y" if i == layers - 1 else p + "y")
    graph = helper.make_graph(
        n, "encoder_layer" if layers == 1 else f"encoder_{layers}_layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(t["x"].shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(t["x"].shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = os.path.join(export_dir, "encoder.onnx")
    # Past 2 GiB a model needs external data; 12 BERT-base layers are ~340 MB.
    onnx.checker.check_model(model)
    onnx.save(model, path)
    with open(os.path.join(export_dir, "inputs.json"), "w") as fh:
        json.dump([{"name": "x", "dims": list(t["x"].shape),
                    "file": os.path.join(export_dir, "x.bin")}], fh)
    return path, t


def ensure_ort():
    ort_dir = os.path.join(HERE, "ort")
    if not os.path.isdir(os.path.join(ort_dir, "node_modules", "onnxruntime-node")):
        env = dict(os.environ, ONNXRUNTIME_NODE_INSTALL="skip")
        subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=ort_dir, check=True,
                       env=env, stdout=subprocess.DEVNULL)
    return ort_dir


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def ort_profile(path, warmup):
    """Per-node median microseconds (the runs after `warmup`) of an ORT profile, in node order."""
    with open(path) as f:
        events = json.load(f)
    times, op = {}, {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            times.setdefault(name, []).append(e["dur"])
            op[name] = e.get("args", {}).get("op_name", "")
    runs = [e["dur"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    nodes = [{"node": n, "op": op[n], "us": statistics.median(t[warmup:] or t)}
             for n, t in times.items()]
    return {"nodes": nodes, "sum_of_nodes_us": sum(x["us"] for x in nodes),
            "run_us": statistics.median(runs[warmup:] or runs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=1, help="1: the layer; 12: BERT-base's encoder")
    ap.add_argument("--ort_no_spin", action="store_true",
                    help="also time ONNX Runtime with its intra-op spinning off, each round")
    ap.add_argument("--baseline", default="",
                    help="another kiln_bench binary, timed in every round beside this build's")
    ap.add_argument("--profile", action="store_true",
                    help="end with per-kernel times of Kiln and per-node times of ONNX Runtime")
    args = ap.parse_args()
    bench = os.path.join(args.build_dir, "bench", "engine", "kiln_bench")
    ort_dir = ensure_ort()
    env = dict(os.environ)
    # Both peers get the same malloc behaviour (MACHINE.md: freed multi-MB
    # buffers otherwise go back to the kernel every call).
    env["GLIBC_TUNABLES"] = "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456"
    layers = ["--layers", str(args.layers)]
    with tempfile.TemporaryDirectory() as tmp:
        run_json([bench, "encoder", "--iters", "3", "--warmup", "1", "--threads",
                  str(args.threads), "--export", tmp] + layers, env)
        model, tensors = build_onnx(tmp)
        ort_out = os.path.join(tmp, "y_ort.bin")
        kiln, ortr, ort_nospin, base = [], [], [], []
        ort_cmd = ["node", os.path.join(ort_dir, "ort_run.js"), model,
                   os.path.join(tmp, "inputs.json"), "--iters", str(args.iters), "--threads",
                   str(args.threads)]
        for r in range(args.rounds):
            kiln.append(run_json([bench, "encoder", "--iters", str(args.iters), "--threads",
                                  str(args.threads)] + layers, env)["p50_ms"])
            if args.baseline:
                base.append(run_json([args.baseline, "encoder", "--iters", str(args.iters),
                                      "--threads", str(args.threads)] + layers, env)["p50_ms"])
            ortr.append(run_json(ort_cmd + (["--out", ort_out] if r == 0 else []), env)["p50_ms"])
            if args.ort_no_spin:
                ort_nospin.append(run_json(ort_cmd + ["--spin", "0"], env)["p50_ms"])
        profile = None
        if args.profile:
            kern = run_json([bench, "encoder", "--iters", "5", "--kernels", "100", "--threads",
                             str(args.threads)] + layers, env)
            warmup = 10
            ort_prof = run_json(ort_cmd + ["--warmup", str(warmup), "--profile",
                                           os.path.join(tmp, "ort_profile")], env)
            profile = {"kiln_kernels": kern["kernels"], "kiln_kernel_gaps_ms": kern["kernel_gaps_ms"],
                       "kiln_report_run_ms": kern["report_run_ms"],
                       "ort": ort_profile(ort_prof["profile"], warmup)}
        y_ort = np.fromfile(ort_out, dtype=np.float32)
        y_kiln = tensors["y_kiln"].reshape(-1)
        max_diff = float(np.max(np.abs(y_ort - y_kiln)))
    k, o = statistics.median(kiln), statistics.median(ortr)
    out = {
        "bench": "encoder_layer_fp32_vs_onnxruntime" if args.layers == 1
                 else "encoder_fp32_vs_onnxruntime", "layers": args.layers,
        "threads": args.threads, "seq": 128, "batch": 1, "rounds": args.rounds,
        "iters_per_round": args.iters, "load": os.getloadavg(),
        "kiln_p50_ms_rounds": kiln, "ort_p50_ms_rounds": ortr,
        "kiln_p50_ms": k, "ort_p50_ms": o, "kiln_over_ort": k / o,
        "max_abs_diff_outputs": max_diff,
    }
    if ort_nospin:
        out["ort_no_spin_p50_ms_rounds"] = ort_nospin
        out["ort_no_spin_p50_ms"] = statistics.median(ort_nospin)
        out["kiln_over_ort_no_spin"] = k / statistics.median(ort_nospin)
    if base:
        out["baseline"] = args.baseline
        out["baseline_p50_ms_rounds"] = base
        out["baseline_p50_ms"] = statistics.median(base)
        out["baseline_over_ort"] = statistics.median(base) / o
        out["kiln_over_baseline"] = k / statistics.median(base)
    if profile:
        out["profile"] = profile
    print(json.dumps(out))
    return 0 if max_diff < 1e-3 * args.layers else 1


if __name__ == "__main__":
    sys.exit(main())
