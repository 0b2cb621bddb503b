"""Greedy decode tokens/s of the GGUF llama decoder (examples/gguf_decoder: 2 layers,
d_model 256, 4/2 heads, q4_k + q8_0 weights, KV cache of 128) three ways in one run,
rounds alternating so drift hits all alike:

  kilnd     the Python client (shared memory on, its default) against kilnd, a
            session on the repository model with the cache as session state
            (and kiln_no_shm: the same with shared_memory=False, bytes in gRPC)
  inproc    the same graph, executables and state binding in process
            (bench/engine/kiln_gguf_decode_bench: Engine::Run, no gRPC)
  torch     the same model in PyTorch (Debian's 1.13, 2 threads), f32 weights
            dequantized from the same GGUF bytes, a preallocated KV cache

Prints one JSON object: per side the median over rounds of decode tokens/s (and the
prefill time), the ratios kilnd/inproc and kilnd/torch, and whether every side
produced the numpy f64 reference's tokens.

  PYTHONPATH=build/clients/python OPENBLAS_CORETYPE=Cooperlake OMP_WAIT_POLICY=PASSIVE \\
      /usr/bin/python3 bench/gguf_decode.py --kilnd build/server/kilnd \\
      --inproc build/bench/engine/kiln_gguf_decode_bench [--rounds 5] [--tokens 64]
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "gguf_decoder"))
import decode as example  # noqa: E402
import llama_gguf  # noqa: E402

import kiln  # noqa: E402

PROMPT = [1, 5, 9, 33, 200, 7, 300, 12]


class Kilnd:
    def __init__(self, binary, repo):
        self.dir = tempfile.mkdtemp(prefix="kiln_bench_gguf.")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", f"--port_file={port_file}", "--metrics_listen=off",
             f"--cache_dir={self.dir}/cache", "--log_level=warn", f"--model_repository={repo}"],
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
        shutil.rmtree(self.dir, ignore_errors=True)


class TorchDecoder:
    """The model in PyTorch f32, weights dequantized from the GGUF bytes."""

    def __init__(self, info):
        self.c = c = llama_gguf.config_of(info)
        self.w = {n: torch.tensor(info.values(n), dtype=torch.float32) for n in info.tensors}
        self.T = c["context"]
        hd = c["head_dim"]
        inv = c["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(self.T, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos, self.sin = torch.cos(ang).float(), torch.sin(ang).float()
        self.cache = torch.zeros(c["layers"], 2, c["kv_heads"], self.T, hd)

    def _rope(self, y, pos):  # [H, S, hd], adjacent pairs
        cos, sin = self.cos[pos], self.sin[pos]
        a, b = y[..., 0::2], y[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)

    def _rms(self, x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.c["rms_eps"]) * w

    @torch.no_grad()
    def step(self, tokens, pos0):
        c, w = self.c, self.w
        hd, hq, hkv = c["head_dim"], c["heads"], c["kv_heads"]
        pos = torch.arange(pos0, pos0 + len(tokens))
        x = w["token_embd.weight"][torch.tensor(tokens)]
        n = pos0 + len(tokens)
        for i in range(c["layers"]):
            p = f"blk.{i}."
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = self._rope((h @ w[p + "attn_q.weight"].T).view(-1, hq, hd).transpose(0, 1), pos)
            k = self._rope((h @ w[p + "attn_k.weight"].T).view(-1, hkv, hd).transpose(0, 1), pos)
            v = (h @ w[p + "attn_v.weight"].T).view(-1, hkv, hd).transpose(0, 1)
            self.cache[i, 0, :, pos0:n] = k
            self.cache[i, 1, :, pos0:n] = v
            ks = self.cache[i, 0, :, :n].repeat_interleave(hq // hkv, 0)
            vs = self.cache[i, 1, :, :n].repeat_interleave(hq // hkv, 0)
            s = q @ ks.transpose(1, 2) / hd ** 0.5
            s = s.masked_fill(torch.arange(n)[None, None, :] > pos[None, :, None], float("-inf"))
            a = torch.softmax(s, -1) @ vs
            x = x + a.transpose(0, 1).reshape(len(tokens), hq * hd) @ w[p + "attn_output.weight"].T
            h = self._rms(x, w[p + "ffn_norm.weight"])
            g = torch.nn.functional.silu(h @ w[p + "ffn_gate.weight"].T)
            x = x + (g * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        h = self._rms(x[-1], w["output_norm.weight"])
        return int(torch.argmax(h @ w["output.weight"].T))

    def decode(self, prompt, n):
        self.cache.zero_()
        t0 = time.perf_counter()
        toks = [self.step(prompt, 0)]
        t1 = time.perf_counter()
        pos = len(prompt)
        for _ in range(n - 1):
            toks.append(self.step([toks[-1]], pos))
            pos += 1
        return toks, t1 - t0, time.perf_counter() - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--inproc", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(2)
    repo = tempfile.mkdtemp(prefix="kiln_bench_gguf_models.")
    model_dir = os.path.join(repo, "tiny_llama", "1")
    _, info = llama_gguf.write_model_dir(model_dir, seed=0)
    want, margin = llama_gguf.Reference(info).generate(PROMPT, a.tokens)
    tdec = TorchDecoder(info)
    server = Kilnd(a.kilnd, repo)
    results = {"kilnd": [], "kilnd_no_shm": [], "inproc": [], "torch": []}
    match = {k: True for k in results}
    n = a.tokens - 1
    try:
        client = kiln.connect(server.addr)
        plain = kiln.Client(server.addr, shared_memory=False)
        sessions = {k: c.create_session(kiln.model("tiny_llama"), state={"cache_out": "cache"})
                    for k, c in (("kilnd", client), ("kilnd_no_shm", plain))}
        zero = np.zeros(llama_gguf.cache_shape(llama_gguf.config_of(info)), np.float32)
        for session in sessions.values():
            example.decode(session, PROMPT, 4)  # compiles prefill and decode once
        for _ in range(a.rounds):
            for k, session in sessions.items():
                session.set_params({"cache": zero})
                toks, pre, dec = example.decode(session, PROMPT, a.tokens)
                results[k].append((n / dec, pre * 1e3))
                match[k] &= toks == want
            out = subprocess.run([a.inproc, "--model", model_dir, "--tokens", str(a.tokens),
                                  "--threads", "2", "--prompt", ",".join(map(str, PROMPT))],
                                 check=True, capture_output=True, text=True)
            r = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
            results["inproc"].append((r["tokens_per_s"], r["prefill_ms"]))
            match["inproc"] &= r["tokens"] == want
            toks, pre, dec = tdec.decode(PROMPT, a.tokens)
            results["torch"].append((n / dec, pre * 1e3))
            match["torch"] &= toks == want
        for session in sessions.values():
            session.close()
        client.close()
        plain.close()
    finally:
        server.stop()
        shutil.rmtree(repo, ignore_errors=True)
    med = {k: {"tokens_per_s": round(statistics.median(t for t, _ in v), 1),
               "prefill_ms": round(statistics.median(p for _, p in v), 3),
               "tokens_per_s_all": [round(t, 1) for t, _ in v]} for k, v in results.items()}
    print(json.dumps({
        "bench": "gguf_decode", "model": "llama 2 layers, d_model 256, heads 4/2, ffn 512, "
                                         "vocab 512, q4_k attn/gate/up, q8_0 down/output",
        "prompt": len(PROMPT), "decode_tokens": n, "rounds": a.rounds, "cpu": platform.processor(),
        "load_avg": os.getloadavg(), "torch": torch.__version__, "torch_threads": 2,
        "kiln": med["kilnd"], "kiln_no_shm": med["kilnd_no_shm"], "kiln_inproc": med["inproc"],
        "pytorch": med["torch"],
        "kilnd_no_shm_vs_inproc": round(
            med["kilnd_no_shm"]["tokens_per_s"] / med["inproc"]["tokens_per_s"], 3),
        "kilnd_vs_inproc": round(med["kilnd"]["tokens_per_s"] / med["inproc"]["tokens_per_s"], 3),
        "kilnd_vs_torch": round(med["kilnd"]["tokens_per_s"] / med["torch"]["tokens_per_s"], 3),
        "inproc_vs_torch": round(med["inproc"]["tokens_per_s"] / med["torch"]["tokens_per_s"], 3),
        "tokens_match_reference": match, "reference_min_margin": round(margin, 5),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
