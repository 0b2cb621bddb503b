"""Where a unary training step's time goes between the Python client and
kilnd, hop by hop (issue 9, "steps per second through kilnd vs in process"):
the MLP 784-512-512-10 (or the CNN) of bench/train_mlp_vs_torch.py, batch 128,
AdamW, the batch in shared memory and the step over kilnd's shared-memory
socket (docs/training.md "Steps over the socket").

Each step is split with clocks both sides read (CLOCK_REALTIME, one host):

  client_pre     step() called -> the request's send (the batch copied into
                 the region, the request built and serialized)
  to_run         the send -> the step's run starting on its device (kilnd's
                 wake, parse, checks, admission, the hand-off to the device's
                 thread and its queue)
  run            the run (DispatchReport.run_micros)
  run_to_answer  the run's end -> the answer received by the client (kilnd's
                 answer built and sent, the client's wake)
  client_post    the answer received -> step() returns (parse, region freed)

The steps are plain step() calls back to back (the answer without a report),
as bench/train_mlp_vs_torch.py times them ("wall"); each step's run times come
from kilnd's dispatch reports, fetched once the series is done (GetReport,
matched by the answers' request ids), so nothing runs between two steps. With --baseline_kilnd another build
(e.g. main's before a change) runs beside this one, alternating series, so
before / after come from one run. With --inproc, kiln_train_bench's median
(the engine in process, no kilnd) is printed beside it.

  PYTHONPATH=build/clients/python OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 \\
      bench/train_step_hops.py --kilnd build/server/kilnd \\
      [--baseline_kilnd OTHER/kilnd] [--inproc build/bench/engine/kiln_train_bench]

Prints one JSON object (medians in ms).
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


class TimedSocket:
    """The shared-memory socket with the last send's and recv's wall times."""

    def __init__(self, sock):
        self._sock = sock
        self.t_send = 0.0
        self.t_recv = 0.0

    def send(self, data):
        self.t_send = time.time()
        return self._sock.send(data)

    def recv(self, n):
        data = self._sock.recv(n)
        self.t_recv = time.time()
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


class Side:
    def __init__(self, label, server, model, init):
        self.label = label
        self.client = kiln.Client(server.addr)
        self.session = self.client.train_session(
            kiln.parse(tb.MODELS[model]["graph"]), loss="loss", params=init,
            optimizer=kiln.AdamW(lr=1e-3), device="cpu:0")
        self.sock = None
        self.hops = {k: [] for k in ("client_pre", "to_run", "run", "run_to_answer",
                                     "client_post", "split_total")}
        self.wall = []

    def timed_socket(self):
        conn = self.client._shm._connection
        if conn is None:
            return None
        if not isinstance(conn._sock, TimedSocket):
            conn._sock = TimedSocket(conn._sock)
        return conn._sock

    def warm_step(self, batch):
        self.session.step(batch)

    def series(self, batches):
        stamps = []
        for b in batches:
            t0 = time.perf_counter()
            t_call = time.time()
            self.session.step(b)
            t_ret = time.time()
            self.wall.append((time.perf_counter() - t0) * 1e3)
            sock = self.timed_socket()
            if sock is None or not self.client.last_train_step_over_shm_socket:
                raise RuntimeError(f"{self.label}: the step did not go over the shared-memory "
                                   "socket")
            stamps.append((self.session.last.request_id, t_call, sock.t_send, sock.t_recv, t_ret))
        reports = {r.request_id: r for r in self.client.report(last=0)}
        h = self.hops
        for request_id, t_call, t_send, t_recv, t_ret in stamps:
            r = reports.get(request_id)
            if r is None:
                continue  # no longer kept
            run_end = (r.start_unix_micros + r.run_micros) / 1e6
            run_start = r.start_unix_micros / 1e6
            h["client_pre"].append((t_send - t_call) * 1e3)
            h["to_run"].append((run_start - t_send) * 1e3)
            h["run"].append(r.run_micros / 1e3)
            h["run_to_answer"].append((t_recv - run_end) * 1e3)
            h["client_post"].append((t_ret - t_recv) * 1e3)
            h["split_total"].append((t_ret - t_call) * 1e3)

    def close(self):
        self.session.close()
        self.client.close()

    def medians(self):
        out = {k: round(statistics.median(v), 4) for k, v in self.hops.items() if v}
        out["wall"] = round(statistics.median(self.wall), 4)
        out["outside_run"] = round(out["split_total"] - out["run"], 4)
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--baseline_kilnd", default="")
    ap.add_argument("--inproc", default="")
    ap.add_argument("--model", default="mlp", choices=sorted(tb.MODELS))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    init = tb.MODELS[args.model]["init"](rng)
    xs = rng.normal(0, 1, (args.steps, tb.BATCH, 784)).astype(np.float32)
    ys = rng.integers(0, 10, (args.steps, tb.BATCH)).astype(np.int64)
    batches = [{"x": xs[i], "y": ys[i]} for i in range(args.steps)]

    servers = [("kilnd", tb.Kilnd(args.kilnd))]
    if args.baseline_kilnd:
        servers.append(("baseline", tb.Kilnd(args.baseline_kilnd)))
    sides = []
    inproc = []
    try:
        sides = [Side(label, server, args.model, init) for label, server in servers]
        for s in sides:  # warm-up: compile, the training set, the connection
            for b in batches[:3]:
                s.warm_step(b)
        for _ in range(args.rounds):
            for s in sides:
                s.series(batches)
            if args.inproc:
                out = subprocess.run([args.inproc, "--model", args.model, "--steps",
                                      str(args.steps), "--threads", "2"],
                                     check=True, capture_output=True, text=True).stdout
                inproc.append(json.loads(out.strip().splitlines()[-1])["median_ms"])
    finally:
        for s in sides:
            s.close()
        for _, server in servers:
            server.stop()
    result = {"bench": f"train_step_hops_{args.model}", "load_average": os.getloadavg()[0],
              "rounds": args.rounds, "steps_per_series": args.steps,
              "median_ms": {s.label: s.medians() for s in sides}}
    if inproc:
        result["median_ms"]["inproc"] = statistics.median(inproc)
        for s in sides:
            result[f"{s.label}_wall_over_inproc"] = round(
                result["median_ms"][s.label]["wall"] / result["median_ms"]["inproc"], 4)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
