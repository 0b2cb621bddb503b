#!/usr/bin/python3
"""Greedy decoding of a GGUF llama model through a running kilnd.

  decode.py write /tmp/models/tiny_llama/1        # the GGUF file, graph and zero cache
  kilnd --model_repository=/tmp/models &           # (started by you)
  decode.py run --model tiny_llama --prompt 1,5,9,33 --tokens 32 [--addr 127.0.0.1:7450]

`run` opens a session on the repository model with the KV cache bound as session
state ({"cache_out": "cache"}), prefills the prompt in one run, then decodes one
token per run (only the token id travels), and prints the tokens and tokens/s.
`--check` also runs the numpy f64 reference of the same GGUF file and compares.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_gguf  # noqa: E402


def decode(session, prompt, n):
    """Prefill + greedy decode; returns (tokens, prefill seconds, decode seconds)."""
    t0 = time.perf_counter()
    out = session.run({"tokens": np.array([prompt], np.int32),
                       "positions": np.arange(len(prompt), dtype=np.int32)})
    t1 = time.perf_counter()
    toks, pos = [int(out["next_token"][0, 0])], len(prompt)
    tok, p = np.zeros((1, 1), np.int32), np.zeros(1, np.int32)
    for _ in range(n - 1):
        tok[0, 0], p[0] = toks[-1], pos
        toks.append(int(session.run({"tokens": tok, "positions": p})["next_token"][0, 0]))
        pos += 1
    return toks, t1 - t0, time.perf_counter() - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write a model version directory")
    w.add_argument("dir")
    w.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run", help="prefill and decode through kilnd")
    r.add_argument("--addr", default=os.environ.get("KILN_ADDR", "127.0.0.1:7450"))
    r.add_argument("--model", default="tiny_llama")
    r.add_argument("--prompt", default="1,5,9,33,200,7,300,12")
    r.add_argument("--tokens", type=int, default=32)
    r.add_argument("--check", metavar="GGUF", help="compare with the numpy reference of this file")
    r.add_argument("--int8-activations", action="store_true",
                   help="let the matmuls round their activations to int8 per 32 values "
                        "(CompileOptions.allow_int8_activations: faster on the CPU, ~0.5%% relative "
                        "error; the exact reference may then pick another token where its top-2 "
                        "logit margin is small)")
    a = ap.parse_args()
    if a.cmd == "write":
        c, _ = llama_gguf.write_model_dir(a.dir, seed=a.seed)
        print(f"wrote {a.dir}: model.gguf ({c['layers']} layers, d_model {c['d_model']}, "
              f"{c['heads']}/{c['kv_heads']} heads, vocab {c['vocab']}), model.pb, state.npz")
        return 0
    import kiln
    prompt = [int(t) for t in a.prompt.split(",")]
    with kiln.connect(a.addr) as client:
        with client.create_session(kiln.model(a.model), state={"cache_out": "cache"},
                                   allow_int8_activations=a.int8_activations) as s:
            toks, prefill, dec = decode(s, prompt, a.tokens)
    print("tokens:", " ".join(map(str, toks)))
    print(f"prefill {len(prompt)} tokens: {prefill * 1e3:.2f} ms; "
          f"decode {len(toks) - 1} tokens: {(len(toks) - 1) / dec:.1f} tokens/s")
    if a.check:
        want, margin = llama_gguf.Reference(llama_gguf.GgufInfo(a.check)).generate(prompt, a.tokens)
        print("reference:", "match" if want == toks else f"DIFFERS: {want}",
              f"(smallest top-2 logit margin {margin:.4f})")
        return 0 if want == toks else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
