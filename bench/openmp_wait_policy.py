#!/usr/bin/python3
"""How long the OpenMP team spins before it sleeps, measured in one run (issue 12 item 1).

One `kiln_bench timings` worker per policy (libgomp reads OMP_WAIT_POLICY and
GOMP_SPINCOUNT only when it loads, so each policy is a process of its own), all started
first; then, round by round, each worker in turn runs a block of the batch-1 MLP and a
block of the BERT-base encoder layer while the others are stopped (SIGSTOP: an idle
worker that spins must not take the core from the one being timed). Policies alternate
block by block, so the host's load phases hit them alike. Then the encoder's 128x768x768
product through dnnl_sgemm in a process with no engine (kiln_bench onednn_matmul: one
thread launches all OpenMP work, as in a plain application), policies alternating
process by process. Then an idle kilnd per policy
(started with it, engine calibrated, so its OpenMP team exists): CPU seconds from
/proc/PID/stat over --idle_seconds. Prints one JSON object: per policy the median (and
p90) over every timed run, and `uptime`'s load before and after.

Every policy is named explicitly ("libgomp default" is GOMP_SPINCOUNT=300000, libgomp's
own default), so the binaries' own choice (base/openmp_policy.h) does not apply.

usage: bench/openmp_wait_policy.py BUILD_DIR [--rounds 15] [--mlp_runs 100]
                                   [--encoder_runs 3] [--idle_seconds 4]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

POLICIES = {
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin_1k": {"GOMP_SPINCOUNT": "1000"},
    "spin_10k": {"GOMP_SPINCOUNT": "10000"},
    "spin_100k": {"GOMP_SPINCOUNT": "100000"},
    "libgomp_default_300k": {"GOMP_SPINCOUNT": "300000"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
}


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def env_for(policy):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["GLIBC_TUNABLES"] = ("glibc.malloc.mmap_threshold=67108864:"
                             "glibc.malloc.trim_threshold=268435456")
    env.update(POLICIES[policy])
    return env


class Worker:
    def __init__(self, bench, env):
        self.p = subprocess.Popen([bench, "timings"], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if not json.loads(self.p.stdout.readline()).get("ready"):
            raise RuntimeError("worker did not start")
        self.p.send_signal(signal.SIGSTOP)

    def time(self, what, n):
        self.p.send_signal(signal.SIGCONT)
        self.p.stdin.write(f"{what} {n}\n")
        self.p.stdin.flush()
        reply = json.loads(self.p.stdout.readline())
        self.p.send_signal(signal.SIGSTOP)
        self.cpu_us_per_run = reply["cpu_us_per_run"]
        return reply["us"]

    def close(self):
        self.p.send_signal(signal.SIGCONT)
        self.p.stdin.close()
        self.p.wait(timeout=60)


def run_json(cmd, env):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def percentile(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick  # utime + stime


def idle_kilnd_cpu_percent(kilnd, env, seconds):
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        p = subprocess.Popen([kilnd, "--listen=127.0.0.1:0", "--port_file", port_file,
                              "--metrics_listen=off", "--cache_dir", os.path.join(tmp, "cache"),
                              "--calibration=always", "--shm_socket=off", "--log_level=warn"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 120
            while not os.path.exists(port_file):
                if p.poll() is not None or time.time() > deadline:
                    raise RuntimeError("kilnd did not start")
                time.sleep(0.05)
            time.sleep(1.0)  # past the start-up work
            c0, t0 = cpu_seconds(p.pid), time.time()
            time.sleep(seconds)
            c1, t1 = cpu_seconds(p.pid), time.time()
            return 100.0 * (c1 - c0) / (t1 - t0)
        finally:
            p.terminate()
            p.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--mlp_runs", type=int, default=100)
    ap.add_argument("--encoder_runs", type=int, default=3)
    ap.add_argument("--idle_seconds", type=float, default=4)
    ap.add_argument("--alone_rounds", type=int, default=3)
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    bench = os.path.join(args.build_dir, "bench", "engine", "kiln_bench")
    kilnd = os.path.join(args.build_dir, "server", "kilnd")
    policies = args.policies.split(",")
    load_before = load()
    workers = {p: Worker(bench, env_for(p)) for p in policies}
    mlp = {p: [] for p in policies}
    enc = {p: [] for p in policies}
    try:
        for r in range(args.rounds):
            order = policies[r % len(policies):] + policies[:r % len(policies)]
            for p in order:
                mlp[p] += workers[p].time("mlp", args.mlp_runs)
                enc[p] += workers[p].time("encoder", args.encoder_runs)
    finally:
        for w in workers.values():
            w.close()
    # The same product through oneDNN alone, in a process of its own with no
    # engine: one thread launches all the OpenMP work, as in a plain
    # application (libgomp keeps the policy's full spin count there).
    alone = {p: [] for p in policies}
    for r in range(args.alone_rounds):
        for p in policies:
            alone[p].append(run_json([bench, "onednn_matmul", "--iters", "100"], env_for(p)))
    load_timed = load()
    idle = {p: idle_kilnd_cpu_percent(kilnd, env_for(p), args.idle_seconds)
            if os.path.exists(kilnd) else None for p in policies}
    out = {"bench": "openmp_wait_policy", "rounds": args.rounds, "mlp_runs": args.mlp_runs,
           "encoder_runs": args.encoder_runs, "load_before": load_before,
           "load_after_timing": load_timed, "load_after": load(), "policies": {}}
    for p in policies:
        out["policies"][p] = {
            "env": POLICIES[p],
            "mlp_b1_us_p50": statistics.median(mlp[p]), "mlp_b1_us_p90": percentile(mlp[p], 0.9),
            # The fastest runs: the policy's cost when the host left the cores alone.
            "mlp_b1_us_p10": percentile(mlp[p], 0.1), "encoder_ms_p10": percentile(enc[p], 0.1) / 1000,
            "encoder_ms_p50": statistics.median(enc[p]) / 1000,
            "encoder_ms_p90": percentile(enc[p], 0.9) / 1000,
            "idle_kilnd_cpu_percent": idle[p],
            "onednn_matmul_alone_us_p50": statistics.median(x["p50_us"] for x in alone[p]),
            "onednn_matmul_alone_us_p10": statistics.median(x["p10_us"] for x in alone[p])}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
