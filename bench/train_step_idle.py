"""How long the device sits idle between two training steps through kilnd, per way
of sending them (issue 9, docs/benchmarks.md "kilnd5"): the MLP 784-512-512-10
(or the CNN) of bench/train_mlp_vs_torch.py, batch 128, AdamW, batches in shared
memory, one kilnd, one session per mode:

  unary          step() per batch (over kilnd's shared-memory socket)
  stream_socket  steps() over the socket (the next step sent when the one before
                 it answered OK)
  stream_grpc    steps() through the TrainSteps stream (shm_train_steps off: the
                 path steps() takes when the socket cannot take the steps)

Per series of --steps steps: the wall time per step, and from kilnd's own
dispatch reports of the series (GetReport; start and run time of each step) the
device's idle time between consecutive steps and the run. Rounds rotate the
modes' order; each round also runs kiln_train_bench (the step in process).

  PYTHONPATH=build/clients/python OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 \\
      bench/train_step_idle.py --kilnd build/server/kilnd \\
      --inproc build/bench/engine/kiln_train_bench [--model mlp] [--rounds 6] [--steps 20]

Prints one JSON object (medians over rounds; ms, idle in us).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import kiln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_mlp_vs_torch as tb  # noqa: E402  (the same graphs, params and kilnd launcher)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--inproc", required=True)
    ap.add_argument("--model", default="mlp", choices=sorted(tb.MODELS))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    m = tb.MODELS[args.model]
    server = tb.Kilnd(args.kilnd)
    try:
        rng = np.random.default_rng(0)
        init = m["init"](rng)
        xs = rng.normal(0, 1, (args.steps, tb.BATCH, 784)).astype(np.float32)
        ys = rng.integers(0, 10, (args.steps, tb.BATCH)).astype(np.int64)
        batches = [{"x": xs[i], "y": ys[i]} for i in range(args.steps)]
        sock_client = kiln.Client(server.addr)
        grpc_client = kiln.Client(server.addr, shm_train_steps=False)
        clients = {"unary": sock_client, "stream_socket": sock_client,
                   "stream_grpc": grpc_client}
        sessions = {mode: c.train_session(kiln.parse(m["graph"]), loss="loss", params=init,
                                          optimizer=kiln.AdamW(lr=1e-3), device="cpu:0")
                    for mode, c in clients.items()}

        def series(mode):
            s = sessions[mode]
            t0 = time.perf_counter()
            if mode == "unary":
                for b in batches:
                    s.step(b)
            elif sum(1 for _ in s.steps(batches)) != args.steps:
                raise RuntimeError(f"{mode}: a step is missing")
            wall = (time.perf_counter() - t0) * 1e3 / args.steps
            reports = clients[mode].report(last=args.steps)
            times = [(r.start_unix_micros, r.run_micros) for r in reports]
            idle = [times[i + 1][0] - (times[i][0] + times[i][1]) for i in range(len(times) - 1)]
            return {"wall_ms": wall, "idle_us": statistics.median(idle),
                    "run_ms": statistics.median(r for _, r in times) / 1e3}

        for mode in sessions:  # warm-up: compiles, regions
            series(mode)
        rows = {mode: [] for mode in sessions}
        inproc = []
        for r in range(args.rounds):
            modes = list(sessions)
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                rows[mode].append(dict(series(mode), load=os.getloadavg()[0]))
            out = subprocess.run([args.inproc, "--model", args.model, "--steps", str(args.steps),
                                  "--threads", "2"], check=True, capture_output=True,
                                 text=True).stdout
            inproc.append(json.loads(out.strip().splitlines()[-1])["median_ms"])
        in_process = statistics.median(inproc)
        result = {"bench": f"train_step_idle_{args.model}", "rounds": args.rounds,
                  "steps_per_series": args.steps, "in_process_ms": in_process,
                  "in_process_rounds": inproc,
                  "stream_over_socket": sock_client.last_train_steps_over_shm_socket}
        for mode, v in rows.items():
            med = {k: statistics.median(x[k] for x in v) for k in ("wall_ms", "idle_us", "run_ms")}
            med["wall_over_in_process"] = med["wall_ms"] / in_process
            med["loads"] = [round(x["load"], 1) for x in v]
            result[mode] = med
        print(json.dumps(result), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
