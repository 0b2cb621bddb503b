"""Where an MLP training step's time goes through kilnd (docs/benchmarks.md,
"mlp9"): per TrainStep of the MLP 784-512-512-10 batch 128 (AdamW, f32,
cpu:0; the batch as bytes, `report: true`), the client's wall time and the
run's own time inside kilnd (DispatchReport.run_micros); each round also runs
kiln_train_bench (the same step in process, Engine::Run) for its median.
Rounds alternate kilnd and in process so drift hits both alike. Prints one
JSON object: medians, run inside kilnd / in process (is the executable slower
in kilnd?) and the time outside the run (client, gRPC, kilnd around the run).

  PYTHONPATH=build/clients/python OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 \\
      bench/train_step_where.py --kilnd build/server/kilnd \\
      --inproc build/bench/engine/kiln_train_bench [--rounds 6] [--steps 20]
"""

import argparse
import json
import os
import statistics
import subprocess
import time

import numpy as np

import kiln
from kiln._proto.kiln.v1 import service_pb2
from train_mlp_vs_torch import GRAPH, Kilnd, init_params


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--inproc", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    server = Kilnd(args.kilnd)
    try:
        rng = np.random.default_rng(0)
        init = init_params(rng)
        xs = rng.normal(0, 1, (args.steps, 128, 784)).astype(np.float32)
        ys = rng.integers(0, 10, (args.steps, 128)).astype(np.int64)
        client = kiln.Client(server.addr, shared_memory=False)
        session = client.train_session(kiln.parse(GRAPH), loss="loss", params=init,
                                       optimizer=kiln.AdamW(lr=1e-3), device="cpu:0")
        wall, run, outside, inproc = [], [], [], []
        for r in range(args.rounds + 1):  # round 0 warms both sides up
            for i in range(args.steps):
                req = service_pb2.TrainStepRequest(session_id=session.id, report=True)
                for name, value in (("x", xs[i]), ("y", ys[i])):
                    kiln._dtypes.to_proto(value, req.inputs.add(name=name).tensor)
                t0 = time.perf_counter()
                resp = client._call("TrainStep", req)
                ms = (time.perf_counter() - t0) * 1e3
                if r:
                    wall.append(ms)
                    run.append(resp.report.run_micros / 1e3)
                    outside.append(ms - resp.report.run_micros / 1e3)
            out = subprocess.run([args.inproc, "--model", "mlp", "--steps", str(args.steps),
                                  "--threads", "2"], check=True, capture_output=True,
                                 text=True).stdout
            if r:
                inproc.append(json.loads(out.strip().splitlines()[-1])["median_ms"])
        session.close()
        client.close()
    finally:
        server.stop()
    med = {"kilnd_wall": statistics.median(wall), "kilnd_run": statistics.median(run),
           "kilnd_outside_run": statistics.median(outside),
           "inproc": statistics.median(inproc)}
    print(json.dumps({
        "bench": "train_step_where_mlp_784_512_512_10_b128_adamw",
        "load_average": os.getloadavg()[0], "rounds": args.rounds, "steps": args.steps,
        "median_ms": med,
        "kilnd_run_over_inproc": med["kilnd_run"] / med["inproc"],
        "kilnd_wall_over_inproc": med["kilnd_wall"] / med["inproc"],
    }), flush=True)


if __name__ == "__main__":
    main()
