#!/usr/bin/python3
"""The Python client's own cost per call (issue 12, item 6): kiln.Client's
session run beside a bare grpcio unary call that sends the same RunRequest bytes
(serialized once, up front) and takes the response bytes without parsing them,
to the same kilnd, interleaved call by call. The difference is what the client
adds: the arrays into the request bytes (one copy, kiln/_wire.py) and the
response's outputs as read-only views of its bytes (no copy).

A third call in each round does what the client did before issue 12 through the
generated protobuf classes (numpy -> Tensor.data -> SerializeToString, then
FromString -> Tensor.data -> a writable copy) around the same bare grpcio call:
the old path and the new one side by side, in one run.

  PYTHONPATH=build/clients/python /usr/bin/python3 bench/python_client_overhead.py \\
      --kilnd build/server/kilnd [--calls 2000]

Graph: y = x * 2 on f32[n], n = 16 (a tiny call) and 1 Mi (4 MiB each way).
Prints one JSON object (p50 / p99 in microseconds and the added p50).
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time

import grpc
import numpy as np

import kiln
from kiln import _dtypes
from kiln._proto.kiln.v1 import service_pb2


def start_kilnd(binary, d):
    port_file = os.path.join(d, "port")
    log = open(os.path.join(d, "log"), "w")
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                             "--metrics_listen=off", f"--cache_dir={d}/cache", "--log_level=warn"],
                            stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kilnd exited {proc.returncode}")
        try:
            with open(port_file) as f:
                return proc, f"127.0.0.1:{int(f.read().strip())}"
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
    raise RuntimeError("kilnd did not start")


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, max(0, int(np.ceil(q * len(v))) - 1))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="kiln_pyoverhead.")
    proc, addr = start_kilnd(args.kilnd, d)
    results = []
    try:
        # Tensor bytes in the messages, as the bare call sends them (a local
        # client would otherwise pass them through shared memory).
        client = kiln.Client(addr, shared_memory=False)
        options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        channel = grpc.insecure_channel(addr, options=options)
        bare = channel.unary_unary("/kiln.v1.Kiln/Run")  # bytes in, bytes out: no (de)serialization
        for n, calls in ((16, args.calls), (1 << 20, max(20, args.calls // 40))):
            g = kiln.parse(f'graph "twice"\ninput x: f32[{n}]\nlet y = x * 2\nout y\n')
            s = client.create_session(g)
            x = np.linspace(-1, 1, n, dtype=np.float32)
            req = service_pb2.RunRequest(session_id=s.id)
            _dtypes.to_proto(x, req.inputs.add(name="x").tensor)
            raw = req.SerializeToString()
            def protobuf_path():
                # The client before issue 12: every bytes field copied on set and get.
                r = service_pb2.RunRequest(session_id=s.id)
                _dtypes.to_proto(x, r.inputs.add(name="x").tensor)
                resp = service_pb2.RunResponse.FromString(bare(r.SerializeToString()))
                return {o.name: _dtypes.from_proto(o.tensor) for o in resp.outputs}

            for _ in range(20):  # warm-up: the executable, every path
                s.run({"x": x})
                bare(raw)
                protobuf_path()
            t_client, t_bare, t_proto = [], [], []
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                y = s.run({"x": x})["y"]
                t1 = time.perf_counter_ns()
                bare(raw)
                t2 = time.perf_counter_ns()
                y_old = protobuf_path()["y"]
                t3 = time.perf_counter_ns()
                t_client.append((t1 - t0) / 1e3)
                t_bare.append((t2 - t1) / 1e3)
                t_proto.append((t3 - t2) / 1e3)
            assert np.array_equal(y, x * 2) and np.array_equal(y_old, y)
            s.close()
            results.append({"elements": n, "bytes_each_way": 4 * n, "calls": calls,
                            "client": {"p50_us": pct(t_client, 0.5), "p99_us": pct(t_client, 0.99)},
                            "bare_grpcio": {"p50_us": pct(t_bare, 0.5), "p99_us": pct(t_bare, 0.99)},
                            "protobuf_path": {"p50_us": pct(t_proto, 0.5),
                                              "p99_us": pct(t_proto, 0.99)},
                            "added_p50_us": pct(t_client, 0.5) - pct(t_bare, 0.5),
                            "protobuf_path_added_p50_us": pct(t_proto, 0.5) - pct(t_bare, 0.5)})
            r = results[-1]
            print(f"python client, {4 * n} bytes each way: client p50 {r['client']['p50_us']:.1f} us, "
                  f"bare grpcio p50 {r['bare_grpcio']['p50_us']:.1f} us (+{r['added_p50_us']:.1f} us); "
                  f"protobuf path p50 {r['protobuf_path']['p50_us']:.1f} us "
                  f"(+{r['protobuf_path_added_p50_us']:.1f} us)", file=__import__("sys").stderr)
        client.close()
        channel.close()
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps({"bench": "python_client_overhead", "host": platform.node(),
                      "grpcio": grpc.__version__, "results": results}))


if __name__ == "__main__":
    main()
