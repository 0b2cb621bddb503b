"""Training step time, MLP 784-512-512-10 (relu, softmax cross-entropy), batch
128, AdamW: Kiln through kilnd (TrainStep over loopback gRPC, the batch sent
each step) beside PyTorch (Debian's 1.13, 2 threads) in one run, rounds
alternating A B A B so drift hits both alike (docs/benchmarks.md, "Training").
Prints one JSON object with the medians.

  PYTHONPATH=build/clients/python OPENBLAS_CORETYPE=Cooperlake OMP_WAIT_POLICY=PASSIVE \\
      /usr/bin/python3 bench/train_mlp_vs_torch.py --kilnd build/server/kilnd \
      [--inproc build/bench/engine/kiln_train_bench] [--rounds 6] [--steps 40]

With --inproc, each round also runs the same step in process (the engine alone,
no gRPC; kiln_train_bench's median over its steps), for "kilnd vs in-process".
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

GRAPH = """graph "bench_mlp"
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


def init_params(rng):
    p = {}
    for i in range(len(SIZES) - 1):
        bound = 1 / np.sqrt(SIZES[i])
        p[f"w{i + 1}"] = rng.uniform(-bound, bound, (SIZES[i], SIZES[i + 1])).astype(np.float32)
        p[f"b{i + 1}"] = rng.uniform(-bound, bound, (SIZES[i + 1],)).astype(np.float32)
    return p


class Kilnd:
    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="kiln_bench_train.")
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
                    self.addr = f"127.0.0.1:{port}"
                    return
            except (FileNotFoundError, ValueError):
                time.sleep(0.05)
        raise RuntimeError("kilnd did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--inproc", default="")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    init = init_params(rng)
    xs = rng.normal(0, 1, (args.steps, BATCH, 784)).astype(np.float32)
    ys = rng.integers(0, 10, (args.steps, BATCH)).astype(np.int64)

    server = Kilnd(args.kilnd)
    client = kiln.connect(server.addr)
    session = client.train_session(kiln.parse(GRAPH), loss="loss", params=init,
                                   optimizer=kiln.AdamW(lr=1e-3), device="cpu:0")
    tensors = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
    opt = torch.optim.AdamW(tensors.values(), lr=1e-3)

    def torch_step(i):
        h = torch.from_numpy(xs[i])
        for k in range(3):
            h = h @ tensors[f"w{k + 1}"] + tensors[f"b{k + 1}"]
            if k < 2:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, torch.from_numpy(ys[i]))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def kiln_step(i):
        session.step({"x": xs[i], "y": ys[i]})

    for i in range(3):  # warm-up: compile, first allocations
        kiln_step(i)
        torch_step(i)
    times = {"kiln_kilnd": [], "torch": []}
    inproc = []
    for _ in range(args.rounds):
        for name, fn in (("kiln_kilnd", kiln_step), ("torch", torch_step)):
            for i in range(args.steps):
                t0 = time.perf_counter()
                fn(i)
                times[name].append((time.perf_counter() - t0) * 1e3)
        if args.inproc:
            out = subprocess.run([args.inproc, "--steps", str(args.steps), "--threads", "2"],
                                 check=True, capture_output=True, text=True).stdout
            inproc.append(json.loads(out.strip().splitlines()[-1])["median_ms"])
    session.close()
    client.close()
    server.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    if inproc:
        med["kiln_inproc"] = statistics.median(inproc)
    print(json.dumps({
        "bench": "train_step_mlp_784_512_512_10_b128_adamw",
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "steps_per_series": args.steps, "rounds": args.rounds,
        "median_ms": med,
        "kiln_over_torch": med["kiln_kilnd"] / med["torch"],
        "kilnd_over_inproc": med["kiln_kilnd"] / med["kiln_inproc"] if inproc else None,
    }))


if __name__ == "__main__":
    main()
