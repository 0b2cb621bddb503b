"""What TLS costs through kilnd: tiny-graph Run p50/p99 and encoder-layer
throughput, plaintext beside TLS in one run (docs/benchmarks.md, "TLS").

Two kilnds from one binary (plaintext, and TLS with a certificate made by the
openssl CLI here), both through the Python client (grpcio 1.51); rounds
alternate A B A B so drift hits both alike. Prints one JSON object.

  PYTHONPATH=build/clients/python /usr/bin/python3 bench/tls_cost.py \
      --kilnd build/server/kilnd [--rounds 6] [--tiny-runs 1000] [--encoder-seconds 3]
"""

import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np

import kiln

ROOT = pathlib.Path(__file__).resolve().parents[1]


def openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d):
    openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/O=Kiln Bench/CN=Kiln Bench CA")
    with open(os.path.join(d, "kilnd.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl(d, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "kilnd.key", "-out", "kilnd.csr", "-subj", "/O=Kiln/CN=kilnd")
    openssl(d, "x509", "-req", "-in", "kilnd.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-sha256", "-extfile", "kilnd.ext",
            "-out", "kilnd.pem")


def start_kilnd(binary, d, name, flags):
    port_file = os.path.join(d, f"{name}.port")
    log = open(os.path.join(d, f"{name}.log"), "w")
    proc = subprocess.Popen(
        [binary, "--listen=127.0.0.1:0", f"--port_file={port_file}", "--metrics_listen=off",
         f"--cache_dir={d}/cache", "--log_level=warn", *flags], stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kilnd {name} exited {proc.returncode}")
        try:
            with open(port_file) as f:
                return proc, f"127.0.0.1:{int(f.read().strip())}"
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
    raise RuntimeError(f"kilnd {name} did not start")


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, max(0, int(np.ceil(q * len(v))) - 1))]


def throughput(fn, threads, seconds):
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def loop(i):
        while time.monotonic() < stop:
            fn()
            counts[i] += 1

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", default=str(ROOT / "build/server/kilnd"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tiny-runs", type=int, default=1000)
    ap.add_argument("--encoder-seconds", type=float, default=3.0)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="kiln_tls_bench.")
    procs = []
    try:
        make_certs(d)
        quota = os.path.join(d, "kilnd.textproto")
        with open(quota, "w") as f:
            f.write("default_quota { max_in_flight: 64 max_queue: 64 }\n")
        common = [f"--config={quota}"]
        plain_proc, plain_addr = start_kilnd(args.kilnd, d, "plain", common)
        procs.append(plain_proc)
        tls_proc, tls_addr = start_kilnd(
            args.kilnd, d, "tls", common + [f"--tls_cert={d}/kilnd.pem", f"--tls_key={d}/kilnd.key"])
        procs.append(tls_proc)
        clients = {"plaintext": kiln.Client(plain_addr, tls=False),
                   "tls": kiln.Client(tls_addr, ca=f"{d}/ca.pem")}
        tiny_text = 'graph "plus_one"\ninput x: f32[1]\nlet y = x + 1\nout y\n'
        encoder_text = (ROOT / "examples/encoder_layer.kiln").read_text()
        rng = np.random.default_rng(1)
        x_tiny = {"x": np.array([41.0], np.float32)}
        x_enc = {"x": rng.standard_normal((1, 128, 768), dtype=np.float32)}
        sessions = {}
        for name, c in clients.items():
            tiny = c.create_session(kiln.parse(tiny_text))
            enc = c.create_session(kiln.parse(encoder_text))
            params = {}
            for p in enc.signature.params:
                shape = [dim.size for dim in p.type.dims]
                params[p.name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
            enc.set_params(params)
            for _ in range(300):
                tiny.run(x_tiny)
            for _ in range(3):
                enc.run(x_enc)
            sessions[name] = (tiny, enc)
        p50 = {n: [] for n in clients}
        p99 = {n: [] for n in clients}
        enc1 = {n: [] for n in clients}
        enc2 = {n: [] for n in clients}
        names = list(clients)
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                tiny, enc = sessions[name]
                lat = []
                for _ in range(args.tiny_runs):
                    t0 = time.perf_counter()
                    tiny.run(x_tiny)
                    lat.append((time.perf_counter() - t0) * 1e6)
                p50[name].append(pct(lat, 0.5))
                p99[name].append(pct(lat, 0.99))
                enc1[name].append(throughput(lambda: enc.run(x_enc), 1, args.encoder_seconds))
                enc2[name].append(throughput(lambda: enc.run(x_enc), 2, args.encoder_seconds))
        med = lambda v: float(np.median(v))
        out = {
            "machine": {"cpu": platform.processor() or platform.machine(),
                        "cores": os.cpu_count(), "kernel": platform.release(),
                        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "client": "Python kiln.Client (grpcio 1.51), sessions",
            "tls_setup": "TLS (gRPC 1.51 + OpenSSL 3), ECDSA P-256 server certificate, no client cert",
            "rounds": args.rounds, "tiny_runs_per_round": args.tiny_runs,
            "encoder_seconds_per_point": args.encoder_seconds,
        }
        for n in names:
            out[n] = {"tiny_p50_us_median_of_rounds": med(p50[n]),
                      "tiny_p99_us_median_of_rounds": med(p99[n]),
                      "encoder_runs_per_s_c1_median": med(enc1[n]),
                      "encoder_runs_per_s_c2_median": med(enc2[n])}
        out["tiny_p50_delta_us"] = out["tls"]["tiny_p50_us_median_of_rounds"] - \
            out["plaintext"]["tiny_p50_us_median_of_rounds"]
        out["tiny_p99_delta_us"] = out["tls"]["tiny_p99_us_median_of_rounds"] - \
            out["plaintext"]["tiny_p99_us_median_of_rounds"]
        out["encoder_c1_tls_pct_of_plaintext"] = 100 * out["tls"]["encoder_runs_per_s_c1_median"] / \
            out["plaintext"]["encoder_runs_per_s_c1_median"]
        out["encoder_c2_tls_pct_of_plaintext"] = 100 * out["tls"]["encoder_runs_per_s_c2_median"] / \
            out["plaintext"]["encoder_runs_per_s_c2_median"]
        print(json.dumps(out))
        for c in clients.values():
            c.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(60)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
