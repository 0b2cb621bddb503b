#!/usr/bin/python3
"""Soak: a real kilnd under c=64 mixed load for a while, checking every answer.

    PYTHONPATH=build/clients/python bench/soak.py --kilnd build/server/kilnd --seconds 600

Clients (closed loop, one thread each) of two tenants: tiny session runs (the
affine graph, params bound once), one-shot runs (the same graph inline, with its
params) and BERT-base encoder-layer session runs (examples/encoder_layer.kiln,
batch 1). Every answer is checked: the affine ones exactly, the encoder's
against its first answer (same inputs, same executable). kilnd's resident memory
(VmRSS) is sampled every second; the report gives it at the start (after the
warm-up), the middle and the end. Errors other than RESOURCE_EXHAUSTED (a quota
refusal, counted apart) fail the soak.

Prints one JSON object on stdout (bench/run_all.sh style); exits 1 when an
answer was wrong, a call failed, or --max-rss-growth-mib is exceeded between the
middle and the end. tests/deploy/soak_test.py runs it for 30 s in `make test`.
"""

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import numpy as np

from kiln import _dtypes
from kiln._proto.kiln.v1 import service_pb2, service_pb2_grpc

SOURCE = pathlib.Path(__file__).resolve().parents[1]
AFFINE = """graph "affine"
input x: f32[batch, 3]
param w: f32[3, 2]
param b: f32[2]
let y = relu(x @ w + b)
out y
"""
W = np.array([[1, 0], [0, 1], [1, 1]], np.float32)
B = np.array([0.5, -0.5], np.float32)
KEYS = {"alice": "alice-soak-key", "bob": "bob-soak-key"}


def config_text():
    t = "default_quota { max_in_flight: 128 max_queue: 128 max_sessions: 128 }\n"
    for name, key in KEYS.items():
        t += (f'tenants {{ name: "{name}" '
              f'api_key_sha256: "{hashlib.sha256(key.encode()).hexdigest()}" }}\n')
    return t


def named(field, **tensors):
    for name, value in tensors.items():
        t = field.add()
        t.name = name
        _dtypes.to_proto(value, t.tensor)


def affine_expected(x):
    return np.maximum(x @ W + B, 0)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Kilnd:
    def __init__(self, binary, cache_dir):
        self.dir = tempfile.mkdtemp(prefix="kiln_soak.")
        with open(f"{self.dir}/config", "w") as f:
            f.write(config_text())
        self.log = open(f"{self.dir}/log", "w+")
        self.proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", f"--port_file={self.dir}/port",
             "--metrics_listen=off", f"--cache_dir={cache_dir}", f"--config={self.dir}/config",
             "--calibration=never", "--log_level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kilnd exited {self.proc.returncode}: {self.output()}")
            try:
                port = int(open(f"{self.dir}/port").read().strip())
                if port:
                    self.addr = f"127.0.0.1:{port}"
                    return
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.02)
        raise RuntimeError("kilnd wrote no port file")

    def output(self):
        self.log.flush()
        return open(f"{self.dir}/log").read()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code


class Soak:
    def __init__(self, addr, args):
        self.addr = addr
        self.args = args
        self.lock = threading.Lock()
        self.counts = {"tiny": 0, "oneshot": 0, "encoder": 0}
        self.refused = 0
        self.errors = []
        self.stop = threading.Event()

    def stub(self, tenant):
        ch = grpc.insecure_channel(self.addr, options=[("grpc.max_receive_message_length", -1),
                                                       ("grpc.max_send_message_length", -1)])
        return ch, service_pb2_grpc.KilnStub(ch), (("authorization", f"Bearer {KEYS[tenant]}"),)

    def session(self, stub, md, text, params):
        create = service_pb2.CreateSessionRequest()
        create.graph.text = text
        named(create.params, **params)
        return stub.CreateSession(create, metadata=md, timeout=600).session_id

    def record(self, kind, ok, error=None):
        with self.lock:
            if ok:
                self.counts[kind] += 1
            elif error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self.refused += 1
            else:
                self.errors.append(f"{kind}: {error.code() if error else ''}: "
                                   f"{error.details() if error else 'wrong answer'}")

    def loop(self, kind, tenant, prepared, i):
        ch, stub, md = self.stub(tenant)
        rng = np.random.default_rng(i)
        try:
            while not self.stop.is_set():
                if kind == "encoder":
                    req, expected = prepared
                else:
                    x = rng.integers(-4, 5, size=(int(rng.integers(1, 9)), 3)).astype(np.float32)
                    if kind == "tiny":
                        req = service_pb2.RunRequest(session_id=prepared)
                    else:
                        req = service_pb2.RunRequest()
                        req.graph.text = AFFINE
                        named(req.params, w=W, b=B)
                    named(req.inputs, x=x)
                    expected = affine_expected(x)
                try:
                    resp = stub.Run(req, metadata=md, timeout=120)
                except grpc.RpcError as e:
                    self.record(kind, False, e)
                    continue
                y = _dtypes.from_proto(resp.outputs[0].tensor)
                if kind == "encoder":
                    good = y.shape == expected.shape and np.allclose(y, expected, rtol=1e-4,
                                                                     atol=1e-4)
                else:
                    good = np.array_equal(y, expected)
                self.record(kind, good)
        finally:
            ch.close()

    def run(self, pid):
        a = self.args
        ch, stub, md = self.stub("alice")
        tiny = {}
        for t in KEYS:
            tch, tstub, tmd = self.stub(t)
            tiny[t] = self.session(tstub, tmd, AFFINE, {"w": W, "b": B})
            tch.close()
        encoder = None
        if a.encoder_clients:
            text = (SOURCE / "examples" / "encoder_layer.kiln").read_text()
            comp = service_pb2.CompileRequest()
            comp.graph.text = text
            comp.input_shapes.add(name="x", dims=[1, 128, 768])
            sig = stub.Compile(comp, metadata=md, timeout=600).signature
            rng = np.random.default_rng(0)
            params = {p.name: (0.02 * rng.standard_normal([d.size for d in p.type.dims]))
                      .astype(np.float32) for p in sig.params}
            sid = self.session(stub, md, text, params)
            req = service_pb2.RunRequest(session_id=sid)
            named(req.inputs, x=rng.standard_normal((1, 128, 768)).astype(np.float32))
            first = _dtypes.from_proto(stub.Run(req, metadata=md, timeout=600).outputs[0].tensor)
            encoder = (req, first)
        ch.close()

        plan = [("encoder", "alice", encoder)] * a.encoder_clients
        rest = a.clients - a.encoder_clients
        for i in range(rest):
            tenant = "alice" if i % 2 == 0 else "bob"
            kind = "tiny" if i % 4 < 2 else "oneshot"
            plan.append((kind, tenant, tiny[tenant] if kind == "tiny" else None))
        threads = [threading.Thread(target=self.loop, args=(k, t, p, i), daemon=True)
                   for i, (k, t, p) in enumerate(plan)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        samples = []  # (seconds, rss KiB)
        while time.monotonic() - t0 < a.seconds:
            time.sleep(1.0)
            samples.append((round(time.monotonic() - t0, 1), rss_kib(pid)))
            if a.progress:
                print(f"soak: {samples[-1][0]:.0f} s rss {samples[-1][1] / 1024:.1f} MiB "
                      f"{self.counts} refused {self.refused} errors {len(self.errors)}",
                      file=sys.stderr)
        self.stop.set()
        for t in threads:
            t.join(180)
        elapsed = time.monotonic() - t0
        start, mid, end = samples[0][1], samples[len(samples) // 2][1], samples[-1][1]
        return {
            "bench": "soak", "seconds": round(elapsed, 1), "clients": a.clients,
            "encoder_clients": a.encoder_clients, "runs": dict(self.counts),
            "runs_per_s": round(sum(self.counts.values()) / elapsed, 1),
            "quota_refusals": self.refused, "errors": len(self.errors),
            "first_errors": self.errors[:5],
            "rss_mib": {"start": round(start / 1024, 1), "middle": round(mid / 1024, 1),
                        "end": round(end / 1024, 1),
                        "max": round(max(r for _, r in samples) / 1024, 1)},
            "rss_growth_middle_to_end_mib": round((end - mid) / 1024, 1),
        }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kilnd", default=str(SOURCE / "build" / "server" / "kilnd"))
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--encoder-clients", type=int, default=4)
    p.add_argument("--max-rss-growth-mib", type=float, default=64,
                   help="fail when RSS grows more than this from the middle to the end")
    p.add_argument("--progress", action="store_true")
    a = p.parse_args()
    cache = tempfile.mkdtemp(prefix="kiln_soak_cache.")
    kilnd = Kilnd(a.kilnd, cache)
    try:
        result = Soak(kilnd.addr, a).run(kilnd.proc.pid)
    finally:
        exit_code = kilnd.stop()
        shutil.rmtree(cache, ignore_errors=True)
    result["kilnd_exit"] = exit_code
    print(json.dumps(result))
    kinds = ["tiny", "oneshot"] + (["encoder"] if a.encoder_clients else [])
    ok = (result["errors"] == 0 and exit_code == 0 and all(result["runs"][k] > 0 for k in kinds) and
          result["rss_growth_middle_to_end_mib"] <= a.max_rss_growth_mib)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
