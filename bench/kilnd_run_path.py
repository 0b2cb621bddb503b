#!/usr/bin/python3
"""Where an encoder layer's Run spends its time through kilnd with the Python
client (issue 12, "encoder layer through kilnd vs in-process <= 5% added";
task kd12), beside the same layer in process and a bare gRPC round trip to the
same kilnd, in one run.

Per round, in an order that rotates (so that no mode always runs first after
another process was busy):
  in_process   the layer in a long-lived `kiln_bench timings` worker (the engine
               alone, 2 threads; the same layer and shapes)
  shm, bytes   kiln.Client with shared memory (the default for a local kilnd) and
               with the tensor bytes in the messages, on a kilnd of their own;
               since sock12 the default client sends the Run itself over kilnd's
               shared-memory socket
  shm_grpc     shared memory with the Run over gRPC (kiln.Client(shm_runs=False)),
               for a build whose client has it: the socket's gain in one kilnd
  grpc_idle    a bare grpc.health Check to that kilnd after the client slept as
               long as the in-process run: what one round trip costs when both
               processes were idle meanwhile, as they are during a Run
  grpc_busy    the same Check back to back
  socket_idle  a 40-byte message to a process that echoes it, over a Unix
               SOCK_SEQPACKET socket, after the same idle time: the floor of
               any local transport with one wake-up each way
Each block starts with --warmup untimed calls. Every timed Run is split with
kilnd's own report (start_unix_micros, run_micros: same host, same clock):
  request_us   the client's call start -> the engine's run start (the client's
               work before sending, gRPC both ways of the host, kilnd's
               admission, the device queue)
  run_us       the engine's run inside kilnd
  response_us  the run's end -> the call returned (kilnd's answer, gRPC, the
               client's work after)
With --before BUILD0 the same client and kilnd of another build (its
clients/python and server/kilnd) run in the same rounds: before and after side
by side.

  /usr/bin/python3 bench/kilnd_run_path.py BUILD [--before BUILD0] [--rounds 6]
      [--runs 12] [--warmup 2]

Prints one JSON object: per build and mode the medians of each part, the
median over rounds of (mode / in_process - 1) in percent, and the load.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MALLOC = "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456"


def load():
    return round(os.getloadavg()[0], 1)


# ---------------------------------------------------------------- the worker
def worker(args):
    """A client of one build (its package on PYTHONPATH) and a kilnd of the
    same build. Reads "shm N W", "bytes N W" and "check N W GAP_US" lines;
    answers one JSON line each."""
    import numpy as np
    import grpc
    import kiln
    from kiln._proto.kiln.v1 import graph_pb2
    from kiln._proto.grpc.health.v1 import health_pb2, health_pb2_grpc
    sys.path.insert(0, HERE)
    from kilnd_vs_ort import start_kilnd

    with open(os.path.join(args.export, "manifest.json")) as f:
        manifest = json.load(f)
    tensors = {e["name"]: np.fromfile(os.path.join(args.export, e["name"] + ".bin"),
                                      dtype=np.float32).reshape(e["dims"])
               for e in manifest["tensors"]}
    with open(os.path.join(args.export, "graph.pb"), "rb") as f:
        graph = graph_pb2.Graph.FromString(f.read())
    params = {k: v for k, v in tensors.items() if k not in ("x", "y_kiln")}
    # The echo process first, before any gRPC channel or thread exists.
    echo_here, echo_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    echo_pid = os.fork()
    if echo_pid == 0:
        echo_here.close()
        while True:
            m = echo_there.recv(64)
            if not m:
                os._exit(0)
            echo_there.send(m)
    echo_there.close()
    d = tempfile.mkdtemp(prefix="kilnd_run_path.")
    proc, addr = start_kilnd(os.path.join(args.worker, "server", "kilnd"), d)
    try:
        sessions, clients = {}, {}
        modes = ["shm", "bytes"]
        try:
            kiln.Client(addr, shm_runs=False).close()
            modes.append("shm_grpc")
        except TypeError:
            pass  # a client without runs over the socket
        for mode in modes:
            if mode == "shm_grpc":
                c = kiln.Client(addr, shm_runs=False)
            else:
                c = kiln.Client(addr, shared_memory=(mode != "bytes"))
            s = c.create_session(graph, device="cpu:0")
            s.set_params(params)
            y = np.asarray(s.run({"x": tensors["x"]})["y"])
            diff = float(np.max(np.abs(y - tensors["y_kiln"])))
            if diff > 1e-4:
                raise RuntimeError(f"kilnd's output ({mode}) differs from in-process by {diff}")
            clients[mode], sessions[mode] = c, s
        if not clients["shm"].last_run_shared_memory:
            raise RuntimeError("the default client did not use shared memory")
        over_socket = getattr(clients["shm"], "last_run_over_shm_socket", False)
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(addr))
        check = health_pb2.HealthCheckRequest()
        x = {"x": tensors["x"]}
        print(json.dumps({"ready": True, "modes": modes, "shm_over_socket": over_socket}),
              flush=True)
        for line in sys.stdin:
            parts = line.split()
            mode, n, warm = parts[0], int(parts[1]), int(parts[2])
            if mode in ("check", "socket"):
                gap = float(parts[3]) / 1e6
                us = []
                for i in range(warm + n):
                    if gap > 0:
                        time.sleep(gap)
                    t0 = time.perf_counter()
                    if mode == "check":
                        health.Check(check)
                    else:
                        echo_here.send(b"x" * 40)
                        echo_here.recv(64)
                    if i >= warm:
                        us.append((time.perf_counter() - t0) * 1e6)
                print(json.dumps({"us": us}), flush=True)
                continue
            s, c = sessions[mode], clients[mode]
            for _ in range(warm):
                s.run(x)
            calls = []
            for _ in range(n):
                t0 = time.time_ns() // 1000
                s.run(x)
                calls.append((t0, time.time_ns() // 1000))
            reports = sorted(c.report(last=n), key=lambda r: r.start_unix_micros)
            rows = []
            for (t0, t1), r in zip(calls, reports):
                start = r.start_unix_micros
                end = start + r.run_micros
                rows.append({"wall_us": t1 - t0, "request_us": start - t0,
                             "run_us": r.run_micros, "response_us": t1 - end,
                             "queue_us": r.queue_micros})
            print(json.dumps({"rows": rows}), flush=True)
        echo_here.close()
        os.waitpid(echo_pid, 0)
    finally:
        proc.terminate()
        proc.wait(30)


# ---------------------------------------------------------------- the driver
class Proc:
    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=env)
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"{cmd[0]} exited before it was ready")
            if "ready" in line:
                self.ready = json.loads(line)
                return

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline()
        if not out:
            raise RuntimeError("a worker exited")
        return json.loads(out)

    def close(self):
        self.p.stdin.close()
        self.p.wait(60)


def med(xs):
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir", nargs="?")
    ap.add_argument("--before", help="another build's directory, run in the same rounds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--export", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    build = os.path.abspath(args.build_dir)
    builds = {"after": build}
    if args.before:
        builds["before"] = os.path.abspath(args.before)
    bench = os.path.join(build, "bench", "engine", "kiln_bench")
    env = dict(os.environ, GLIBC_TUNABLES=MALLOC)
    out = {"bench": "kilnd_run_path", "load_at_start": load(), "rounds": args.rounds,
           "runs": args.runs, "builds": builds,
           "model": "BERT-base encoder layer, f32, batch 1, seq 128, 2 threads"}
    with tempfile.TemporaryDirectory() as tmp:
        export = os.path.join(tmp, "enc")
        subprocess.run([bench, "encoder", "--iters", "2", "--warmup", "1", "--export", export],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        inproc = Proc([bench, "timings", "--threads", "2"], env)
        workers = {}
        for name, b in builds.items():
            wenv = dict(env, PYTHONPATH=os.path.join(b, "clients", "python"))
            workers[name] = Proc([sys.executable, os.path.abspath(__file__), "--worker", b,
                                  "--export", export], wenv)
        blocks = [("in_process", None)]
        run_modes = {}
        for name in builds:
            run_modes[name] = workers[name].ready.get("modes", ["shm", "bytes"])
            out.setdefault("shm_over_socket", {})[name] = workers[name].ready.get(
                "shm_over_socket", False)
            blocks += [(name, m) for m in run_modes[name]]
            blocks += [(name, "grpc_idle"), (name, "grpc_busy")]
        blocks.append((next(iter(builds)), "socket_idle"))
        rows = {}  # (build, mode) -> [row]
        per_round = []
        for r in range(args.rounds):
            order = blocks[r % len(blocks):] + blocks[:r % len(blocks)]
            got = {"load": load()}
            inproc_us = None
            for name, mode in order:
                if mode is None:
                    us = inproc.ask(f"encoder {args.warmup + args.runs}")["us"][args.warmup:]
                    inproc_us = statistics.median(us)
                    got["in_process_us"] = inproc_us
                    rows.setdefault(("in_process", ""), []).extend({"wall_us": u} for u in us)
                    continue
                w = workers[name]
                if mode.startswith("grpc") or mode == "socket_idle":
                    # Idle as long as a Run keeps the client waiting (the last
                    # in-process median; 6 ms, the layer on a quiet host, before one).
                    last = inproc_us or (per_round[-1]["in_process_us"] if per_round else 6000)
                    gap = int(last) if mode.endswith("idle") else 0
                    what = "socket" if mode == "socket_idle" else "check"
                    us = w.ask(f"{what} {args.runs} {args.warmup} {gap}")["us"]
                    rows.setdefault((name, mode), []).extend({"wall_us": u} for u in us)
                    got[f"{name}_{mode}_us"] = statistics.median(us)
                    continue
                rs = w.ask(f"{mode} {args.runs} {args.warmup}")["rows"]
                rows.setdefault((name, mode), []).extend(rs)
                got[f"{name}_{mode}_us"] = statistics.median(x["wall_us"] for x in rs)
            for name in builds:
                for mode in run_modes[name]:
                    got[f"{name}_{mode}_added_pct"] = 100 * (got[f"{name}_{mode}_us"] / inproc_us - 1)
            per_round.append(got)
        inproc.close()
        for w in workers.values():
            w.close()
    summary = {}
    base = med([x["wall_us"] for x in rows[("in_process", "")]])
    for (name, mode), rs in rows.items():
        key = name if not mode else f"{name}_{mode}"
        summary[key] = {k: round(med([x[k] for x in rs]), 1) for k in rs[0]}
        if mode in ("shm", "bytes", "shm_grpc"):
            summary[key]["added_pct_median_of_rounds"] = round(
                med([g[f"{name}_{mode}_added_pct"] for g in per_round]), 1)
            summary[key]["added_us_over_in_process"] = round(summary[key]["wall_us"] - base, 1)
    out["summary"] = summary
    out["per_round"] = per_round
    out["target_pct"] = 5
    out["load_at_end"] = load()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
