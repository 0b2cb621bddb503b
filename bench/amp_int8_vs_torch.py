"""AMP training steps and int8 inference, Kiln beside PyTorch 1.13 (Debian's,
2 threads) in one run, rounds alternating so drift hits both alike
(docs/benchmarks.md, "AMP and int8"). MLP 784-512-512-10, batch 128.

  PYTHONPATH=build/clients/python OPENBLAS_CORETYPE=Cooperlake OMP_WAIT_POLICY=PASSIVE \\
      OMP_NUM_THREADS=2 /usr/bin/python3 bench/amp_int8_vs_torch.py --kilnd build/server/kilnd \\
      [--rounds 5] [--steps 30]

Training (TrainStep through kilnd, AdamW): Kiln f32, bf16 AMP and f16 AMP
(dynamic loss scaling) steps; PyTorch f32 and torch.autocast("cpu", bf16).
Inference (Run through kilnd): Kiln's f32 forward and its int8 form (the
graph engine/quant/int8_export.h writes: dynamic per-tensor activation
quantization, per-channel int8 weights, oneDNN's s8 x s8 -> s32 matmul);
PyTorch f32 and torch.ao.quantization.quantize_dynamic (fbgemm's dynamic int8
Linear, per-tensor weights). Prints one JSON object with medians (ms).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time

import numpy as np
import torch

import kiln

SIZES = (784, 512, 512, 10)
BATCH = 128

TRAIN = """graph "bench_mlp"
input x: f32[128, 784]
input y: i64[128]
param w1: f32[784, 512]
param b1: f32[512]
param w2: f32[512, 512]
param b2: f32[512]
param w3: f32[512, 10]
param b3: f32[10]
let h1 = relu(x @ w1 + b1)
let h2 = relu(h1 @ w2 + b2)
let logits = h2 @ w3 + b3
let loss = softmax_cross_entropy(logits, y)
out loss
"""

F32_FORWARD = TRAIN.replace("let loss = softmax_cross_entropy(logits, y)\nout loss\n",
                            "out logits\n").replace("input y: i64[128]\n", "")


def int8_layer(i, x):
    return (f"let q{i} = quantize({x}, reduce_max(abs({x})) / 127.0, bits=8, symmetric=true, to=i8)\n"
            f"let y{i} = cast(matmul(q{i}, w{i}), to=f32) * (reduce_max(abs({x})) / 127.0 * s{i}) + b{i}\n")


INT8_FORWARD = ('graph "bench_mlp_int8"\ninput x: f32[128, 784]\n' + "".join(
    f"param w{i + 1}: i8[{SIZES[i]}, {SIZES[i + 1]}]\nparam s{i + 1}: f32[{SIZES[i + 1]}]\n"
    f"param b{i + 1}: f32[{SIZES[i + 1]}]\n" for i in range(3)) +
    int8_layer(1, "x") + "let h1 = relu(y1)\n" + int8_layer(2, "h1") + "let h2 = relu(y2)\n" +
    int8_layer(3, "h2") + "out logits = y3\n")


class Kilnd:
    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="kiln_bench_amp.")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", f"--port_file={port_file}", "--metrics_listen=off",
             f"--cache_dir={self.dir}/cache", "--log_level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with open(port_file) as f:
                    port = int(f.read().strip())
                if port > 0:
                    self.client = kiln.connect(f"127.0.0.1:{port}")
                    return
            except (FileNotFoundError, ValueError):
                time.sleep(0.05)
        raise RuntimeError("kilnd did not start")

    def stop(self):
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)


def init_params(rng):
    p = {}
    for i in range(3):
        bound = 1 / np.sqrt(SIZES[i])
        p[f"w{i + 1}"] = rng.uniform(-bound, bound, (SIZES[i], SIZES[i + 1])).astype(np.float32)
        p[f"b{i + 1}"] = rng.uniform(-bound, bound, (SIZES[i + 1],)).astype(np.float32)
    return p


def int8_params(p):
    q = {}
    for i in range(1, 4):
        w = p[f"w{i}"]
        s = np.maximum(np.abs(w).max(axis=0), 1e-30).astype(np.float32) / np.float32(127)
        q[f"w{i}"] = np.clip(np.rint(w / s), -128, 127).astype(np.int8)
        q[f"s{i}"] = s
        q[f"b{i}"] = p[f"b{i}"]
    return q


def timed(fn, n):
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def torch_mlp(p):
    m = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 10))
    with torch.no_grad():
        for i, layer in zip(range(1, 4), (m[0], m[2], m[4])):
            layer.weight.copy_(torch.from_numpy(p[f"w{i}"].T.copy()))
            layer.bias.copy_(torch.from_numpy(p[f"b{i}"]))
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    p = init_params(rng)
    x = rng.uniform(0, 1, (BATCH, 784)).astype(np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.int64)
    kd = Kilnd(args.kilnd)
    c = kd.client
    sessions = {}
    for name, amp in (("kiln_f32", None), ("kiln_bf16", kiln.Amp("bf16")),
                      ("kiln_f16", kiln.Amp("f16"))):
        sessions[name] = c.train_session(kiln.parse(TRAIN), loss="loss", params=p,
                                         optimizer=kiln.AdamW(lr=1e-3), device="cpu:0", amp=amp)
    f32_fwd = c.create_session(kiln.parse(F32_FORWARD), params=p, device="cpu:0")
    int8_fwd = c.create_session(kiln.parse(INT8_FORWARD), params=int8_params(p), device="cpu:0")
    tm = torch_mlp(p)
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step(autocast):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(tm(tx), ty)
        loss.backward()
        opt.step()

    tq = torch.ao.quantization.quantize_dynamic(torch_mlp(p).eval(), {torch.nn.Linear},
                                                dtype=torch.qint8)
    tf = torch_mlp(p).eval()
    rows = {k: [] for k in ("kiln_f32", "kiln_bf16", "kiln_f16", "torch_f32", "torch_bf16_autocast",
                            "infer_kiln_f32", "infer_kiln_int8", "infer_torch_f32",
                            "infer_torch_int8_dynamic")}
    for _ in range(args.rounds):
        for name, s in sessions.items():
            rows[name].append(timed(lambda s=s: s.step({"x": x, "y": y}), args.steps))
        rows["torch_f32"].append(timed(lambda: torch_step(False), args.steps))
        rows["torch_bf16_autocast"].append(timed(lambda: torch_step(True), args.steps))
        rows["infer_kiln_f32"].append(timed(lambda: f32_fwd.run({"x": x}), args.steps))
        rows["infer_kiln_int8"].append(timed(lambda: int8_fwd.run({"x": x}), args.steps))
        with torch.no_grad():
            rows["infer_torch_f32"].append(timed(lambda: tf(tx), args.steps))
            rows["infer_torch_int8_dynamic"].append(timed(lambda: tq(tx), args.steps))
    med = {k: round(statistics.median(v), 3) for k, v in rows.items()}
    ranges = {k: [round(min(v), 3), round(max(v), 3)] for k, v in rows.items()}
    # Agreement of the int8 forward with f32 (a sanity check of the graph).
    a = np.asarray(f32_fwd.run({"x": x})["logits"])
    b = np.asarray(int8_fwd.run({"x": x})["logits"])
    kd.stop()
    print(json.dumps({
        "machine": platform.processor() or platform.machine(), "load": os.getloadavg(),
        "median_ms": med, "range_of_round_medians_ms": ranges,
        "ratios": {
            "kiln_bf16_over_kiln_f32": round(med["kiln_bf16"] / med["kiln_f32"], 3),
            "kiln_f16_over_kiln_f32": round(med["kiln_f16"] / med["kiln_f32"], 3),
            "kiln_f32_over_torch_f32": round(med["kiln_f32"] / med["torch_f32"], 3),
            "kiln_bf16_over_torch_bf16": round(med["kiln_bf16"] / med["torch_bf16_autocast"], 3),
            "infer_kiln_int8_over_kiln_f32": round(med["infer_kiln_int8"] / med["infer_kiln_f32"], 3),
            "infer_kiln_int8_over_torch_int8": round(
                med["infer_kiln_int8"] / med["infer_torch_int8_dynamic"], 3),
        },
        "int8_vs_f32_logits_max_abs_diff": float(np.abs(a - b).max()),
    }, indent=1))


if __name__ == "__main__":
    main()
