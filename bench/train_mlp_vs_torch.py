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

The client sends each batch through shared memory when kilnd is local (its
default; "kiln_kilnd"); a second session of a client with shared_memory=False
sends it as bytes in the request ("kiln_kilnd_bytes"), in the same rounds; a
third trains on each round's batches through one steps() call
("kiln_kilnd_stream": over kilnd's shared-memory socket when it is local, else a
TrainSteps stream; each step timed from the previous step's loss to its own and
the median taken, as for the unary steps; "kiln_kilnd_stream_mean" is the
series' mean per step), and the bytes client streams them through TrainSteps
("kiln_kilnd_stream_bytes").

The unary steps of "kiln_kilnd" go over kilnd's shared-memory socket when it
takes them there (docs/training.md "Steps over the socket";
"step_over_shm_socket" says whether they did); "kiln_kilnd_grpc" is the same
step of a client with shm_train_steps=False (the batch in shared memory, the
call over gRPC), in the same rounds.

--baseline_kilnd (and --baseline_inproc) name another build (e.g. main's
before a change): its kilnd runs beside this one and its unary steps
("kiln_kilnd_baseline"), its streamed steps ("kiln_kilnd_stream_baseline",
batches in shared memory when local) and in-process step
("kiln_inproc_baseline") are timed in the same rounds, so before / after come
from one run.
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


CNN_GRAPH = """graph "bench_cnn"
input x: f32[128, 784]
input y: i64[128]
param c1_w: f32[16, 1, 3, 3]
param c1_b: f32[16]
param c2_w: f32[32, 16, 3, 3]
param c2_b: f32[32]
param fc_w: f32[1568, 10]
param fc_b: f32[10]
let img = reshape(x, shape=[-1, 1, 28, 28])
let h1 = max_pool(relu(conv(img, c1_w, c1_b, pad_low=[1, 1], pad_high=[1, 1])), window=[2, 2])
let h2 = max_pool(relu(conv(h1, c2_w, c2_b, pad_low=[1, 1], pad_high=[1, 1])), window=[2, 2])
let logits = reshape(h2, shape=[-1, 1568]) @ fc_w + fc_b
let loss = softmax_cross_entropy(logits, y)
out loss
"""

CNN_SHAPES = {"c1_w": (16, 1, 3, 3), "c1_b": (16,), "c2_w": (32, 16, 3, 3), "c2_b": (32,),
              "fc_w": (1568, 10), "fc_b": (10,)}


def init_cnn(rng):
    """torch.nn.Conv2d / Linear's bounds: +-1/sqrt(fan in)."""
    fan_in = {"c1": 9, "c2": 144, "fc": 1568}
    return {n: rng.uniform(-1, 1, s).astype(np.float32) / np.float32(np.sqrt(fan_in[n[:2]]))
            for n, s in CNN_SHAPES.items()}


def torch_cnn_loss(t, x, y):
    f = torch.nn.functional
    h = f.conv2d(x.reshape(-1, 1, 28, 28), t["c1_w"], t["c1_b"], padding=1)
    h = f.max_pool2d(torch.relu(h), 2)
    h = f.conv2d(h, t["c2_w"], t["c2_b"], padding=1)
    h = f.max_pool2d(torch.relu(h), 2)
    return f.cross_entropy(h.reshape(-1, 1568) @ t["fc_w"] + t["fc_b"], y)


def torch_mlp_loss(t, x, y):
    h = x
    for k in range(3):
        h = h @ t[f"w{k + 1}"] + t[f"b{k + 1}"]
        if k < 2:
            h = torch.relu(h)
    return torch.nn.functional.cross_entropy(h, y)


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


MODELS = {
    "mlp": {"graph": GRAPH, "init": lambda rng: init_params(rng), "loss": torch_mlp_loss,
            "bench": "train_step_mlp_784_512_512_10_b128_adamw"},
    "cnn": {"graph": CNN_GRAPH, "init": init_cnn, "loss": torch_cnn_loss,
            "bench": "train_step_cnn_fashion_b128_adamw"},
}


def bench_model(args, server, name, baseline=None):
    m = MODELS[name]
    rng = np.random.default_rng(0)
    init = m["init"](rng)
    xs = rng.normal(0, 1, (args.steps, BATCH, 784)).astype(np.float32)
    ys = rng.integers(0, 10, (args.steps, BATCH)).astype(np.int64)

    client = kiln.connect(server.addr)
    session = client.train_session(kiln.parse(m["graph"]), loss="loss", params=init,
                                   optimizer=kiln.AdamW(lr=1e-3), device="cpu:0")
    grpc_client = kiln.Client(server.addr, shm_train_steps=False)
    grpc_session = grpc_client.train_session(kiln.parse(m["graph"]), loss="loss", params=init,
                                             optimizer=kiln.AdamW(lr=1e-3), device="cpu:0")
    bytes_client = kiln.Client(server.addr, shared_memory=False)
    bytes_session = bytes_client.train_session(kiln.parse(m["graph"]), loss="loss", params=init,
                                               optimizer=kiln.AdamW(lr=1e-3), device="cpu:0")
    stream_session = client.train_session(kiln.parse(m["graph"]), loss="loss", params=init,
                                          optimizer=kiln.AdamW(lr=1e-3), device="cpu:0")
    bytes_stream_session = bytes_client.train_session(
        kiln.parse(m["graph"]), loss="loss", params=init, optimizer=kiln.AdamW(lr=1e-3),
        device="cpu:0")
    base_client = base_session = None
    if baseline is not None:
        base_client = kiln.Client(baseline.addr)  # not connect(): that closes the default client
        base_session = base_client.train_session(kiln.parse(m["graph"]), loss="loss",
                                                 params=init, optimizer=kiln.AdamW(lr=1e-3),
                                                 device="cpu:0")
        base_stream_session = base_client.train_session(
            kiln.parse(m["graph"]), loss="loss", params=init, optimizer=kiln.AdamW(lr=1e-3),
            device="cpu:0")
    batches = [{"x": xs[i], "y": ys[i]} for i in range(args.steps)]
    tensors = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
    opt = torch.optim.AdamW(tensors.values(), lr=1e-3)

    def torch_step(i):
        loss = m["loss"](tensors, torch.from_numpy(xs[i]), torch.from_numpy(ys[i]))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def kiln_step(i):
        session.step({"x": xs[i], "y": ys[i]})

    def kiln_grpc_step(i):
        grpc_session.step({"x": xs[i], "y": ys[i]})

    def kiln_bytes_step(i):
        bytes_session.step({"x": xs[i], "y": ys[i]})

    def kiln_base_step(i):
        base_session.step({"x": xs[i], "y": ys[i]})

    for i in range(3):  # warm-up: compile, first allocations
        kiln_step(i)
        kiln_grpc_step(i)
        kiln_bytes_step(i)
        torch_step(i)
        if base_session is not None:
            kiln_base_step(i)
    list(stream_session.steps(batches[:3]))
    if base_session is not None:
        list(base_stream_session.steps(batches[:3]))
    stream_shared_memory = client.last_train_steps_shared_memory
    list(bytes_stream_session.steps(batches[:3]))
    shared_memory = client.last_train_step_shared_memory
    over_socket = getattr(client, "last_train_step_over_shm_socket", False)
    times = {"kiln_kilnd": [], "kiln_kilnd_grpc": [], "kiln_kilnd_bytes": [], "torch": [],
             "kiln_kilnd_stream": [], "kiln_kilnd_stream_bytes": []}
    series = [("kiln_kilnd", kiln_step), ("torch", torch_step),
              ("kiln_kilnd_grpc", kiln_grpc_step), ("kiln_kilnd_bytes", kiln_bytes_step)]
    if base_session is not None:
        times["kiln_kilnd_baseline"] = []
        times["kiln_kilnd_stream_baseline"] = []
        series.append(("kiln_kilnd_baseline", kiln_base_step))
    inproc, inproc_base = [], []
    stream_means = {}
    for _ in range(args.rounds):
        for label, fn in series:
            for i in range(args.steps):
                t0 = time.perf_counter()
                fn(i)
                times[label].append((time.perf_counter() - t0) * 1e3)
        # The streamed steps: one steps() call for the series, each step timed
        # from the previous step's loss to its own (the first from the call),
        # so that its median is taken as the unary steps' is; the series' mean
        # per step goes beside it ("<label>_mean": a mean counts the slow
        # stretches of a loaded host that a median leaves out).
        streams = [("kiln_kilnd_stream", stream_session),
                   ("kiln_kilnd_stream_bytes", bytes_stream_session)]
        if base_session is not None:
            streams.append(("kiln_kilnd_stream_baseline", base_stream_session))
        for label, sess in streams:
            t0 = last = time.perf_counter()
            for _ in sess.steps(batches):
                now = time.perf_counter()
                times[label].append((now - last) * 1e3)
                last = now
            stream_means.setdefault(label + "_mean", []).append((last - t0) * 1e3 / args.steps)
        for binary, into in ((args.inproc, inproc), (args.baseline_inproc, inproc_base)):
            if binary:
                out = subprocess.run([binary, "--model", name, "--steps", str(args.steps),
                                      "--threads", "2"],
                                     check=True, capture_output=True, text=True).stdout
                into.append(json.loads(out.strip().splitlines()[-1])["median_ms"])
    if base_session is not None:
        base_session.close()
        base_stream_session.close()
        base_client.close()
    bytes_stream_session.close()
    grpc_session.close()
    grpc_client.close()
    session.close()
    stream_session.close()
    client.close()
    bytes_session.close()
    bytes_client.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    med.update({k: statistics.median(v) for k, v in stream_means.items()})
    if inproc:
        med["kiln_inproc"] = statistics.median(inproc)
    if inproc_base:
        med["kiln_inproc_baseline"] = statistics.median(inproc_base)
    print(json.dumps({
        "bench": m["bench"],
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "steps_per_series": args.steps, "rounds": args.rounds,
        "batch_through_shared_memory": shared_memory,
        "stream_batches_through_shared_memory": stream_shared_memory,
        "step_over_shm_socket": over_socket,
        "median_ms": med,
        "kiln_over_torch": med["kiln_kilnd"] / med["torch"],
        "kiln_inproc_over_torch": med["kiln_inproc"] / med["torch"] if inproc else None,
        "kilnd_over_inproc": med["kiln_kilnd"] / med["kiln_inproc"] if inproc else None,
        "kilnd_grpc_over_inproc":
            med["kiln_kilnd_grpc"] / med["kiln_inproc"] if inproc else None,
        "kilnd_bytes_over_inproc":
            med["kiln_kilnd_bytes"] / med["kiln_inproc"] if inproc else None,
        "kilnd_stream_over_inproc":
            med["kiln_kilnd_stream"] / med["kiln_inproc"] if inproc else None,
        "kilnd_stream_over_torch": med["kiln_kilnd_stream"] / med["torch"],
        "kilnd_over_baseline_kilnd":
            med["kiln_kilnd"] / med["kiln_kilnd_baseline"] if base_session else None,
        "kilnd_stream_over_baseline_kilnd_stream":
            med["kiln_kilnd_stream"] / med["kiln_kilnd_stream_baseline"] if base_session else None,
        "baseline_kilnd_stream_over_inproc":
            med["kiln_kilnd_stream_baseline"] / med["kiln_inproc"]
            if base_session and inproc else None,
        "baseline_kilnd_over_torch":
            med["kiln_kilnd_baseline"] / med["torch"] if base_session else None,
        "baseline_kilnd_over_baseline_inproc":
            med["kiln_kilnd_baseline"] / med["kiln_inproc_baseline"]
            if base_session and inproc_base else None,
        "baseline_kilnd_stream_over_baseline_inproc":
            med["kiln_kilnd_stream_baseline"] / med["kiln_inproc_baseline"]
            if base_session and inproc_base else None,
        "inproc_over_baseline_inproc":
            med["kiln_inproc"] / med["kiln_inproc_baseline"] if inproc and inproc_base else None,
    }), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--inproc", default="")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--baseline_kilnd", default="")
    ap.add_argument("--baseline_inproc", default="")
    args = ap.parse_args()
    torch.set_num_threads(2)
    server = Kilnd(args.kilnd)
    baseline = None
    try:
        baseline = Kilnd(args.baseline_kilnd) if args.baseline_kilnd else None
        for name in args.models.split(","):
            bench_model(args, server, name, baseline)
    finally:
        server.stop()
        if baseline is not None:
            baseline.stop()


if __name__ == "__main__":
    main()
