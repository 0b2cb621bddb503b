#!/usr/bin/python3
"""Train the character-level GPT of char_gpt.kiln on a text file through kilnd,
then sample from it greedily (examples/char_gpt/README.md).

  PYTHONPATH=build/clients/python /usr/bin/python3 examples/char_gpt/char_gpt.py \\
      --kilnd build/server/kilnd [--text /usr/share/common-licenses/GPL-3] [--steps 600]

(--addr HOST:PORT uses a running kilnd instead of starting one.) The text is
mapped to 96 symbols (newline and printable ASCII; anything else becomes '?'),
batches are random windows of 64 characters (x) and the same windows shifted by
one (y), drawn from a seeded generator, and the model trains with AdamW in one
training session; afterwards `Run` on the same session (the trained weights,
no copy) continues a prompt one character at a time, taking the argmax.

The module also serves the tests (tests/clients/python_char_gpt_test.py) and
the GPU step benchmark: `encode`, `batches`, `init_params` and `PARAM_SHAPES`
describe exactly the model of char_gpt.kiln, and torch_char_gpt.py is the same
model in PyTorch.
"""

import argparse
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
GRAPH_PATH = HERE / "char_gpt.kiln"

# The model of char_gpt.kiln; the tests check these against the graph's params.
SEQ, D_MODEL, HEADS, D_FF, VOCAB, LAYERS = 64, 64, 4, 256, 96, 2


def param_shapes():
    """{name: shape} of every param of char_gpt.kiln, in the graph's order."""
    shapes = {"wte": (VOCAB, D_MODEL), "wpe": (SEQ, D_MODEL)}
    for layer in range(LAYERS):
        p = f"l{layer}_"
        shapes.update({
            p + "ln1_g": (D_MODEL,), p + "ln1_b": (D_MODEL,),
            p + "wq": (D_MODEL, D_MODEL), p + "bq": (D_MODEL,),
            p + "wk": (D_MODEL, D_MODEL), p + "bk": (D_MODEL,),
            p + "wv": (D_MODEL, D_MODEL), p + "bv": (D_MODEL,),
            p + "wo": (D_MODEL, D_MODEL), p + "bo": (D_MODEL,),
            p + "ln2_g": (D_MODEL,), p + "ln2_b": (D_MODEL,),
            p + "w1": (D_MODEL, D_FF), p + "b1": (D_FF,),
            p + "w2": (D_FF, D_MODEL), p + "b2": (D_MODEL,)})
    shapes.update({"lnf_g": (D_MODEL,), "lnf_b": (D_MODEL,), "w_head": (D_MODEL, VOCAB)})
    return shapes


PARAM_SHAPES = param_shapes()


def graph_text():
    return GRAPH_PATH.read_text()


def encode(text):
    """Token ids (np.int64): newline -> 0, ' '..'~' -> 1..95, anything else as '?'."""
    raw = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8).astype(np.int64)
    ids = raw - 31
    ids[raw == 10] = 0
    ids[(ids < 0) & (raw != 10)] = ord("?") - 31
    ids[ids >= VOCAB] = ord("?") - 31
    return ids


def decode(ids):
    return "".join("\n" if i == 0 else chr(int(i) + 31) for i in ids)


def batches(ids, batch, steps, seed):
    """`steps` batches of `batch` random windows: x = ids[s:s+SEQ], y = ids[s+1:s+SEQ+1]."""
    rng = np.random.default_rng(seed)
    offsets = np.arange(SEQ)
    for _ in range(steps):
        starts = rng.integers(0, len(ids) - SEQ - 1, size=batch)
        rows = starts[:, None] + offsets[None, :]
        yield {"x": ids[rows], "y": ids[rows + 1]}


def init_params(seed):
    """GPT-2's initialisation: weights N(0, 0.02), biases 0, layer-norm gains 1;
    the projections into the residual stream (wo, w2) scaled by 1/sqrt(2 layers)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in PARAM_SHAPES.items():
        if name.endswith("_g"):
            v = np.ones(shape)
        elif len(shape) == 1:
            v = np.zeros(shape)
        else:
            std = 0.02 / math.sqrt(2 * LAYERS) if name.endswith(("wo", "w2")) else 0.02
            v = rng.normal(0, std, size=shape)
        out[name] = v.astype(np.float32)
    return out


def optimizer(kiln, lr, steps, warmup):
    """AdamW (weight decay 0.01 on matrices only) with a linear warm-up and cosine decay."""
    no_decay = [n for n, s in PARAM_SHAPES.items() if len(s) == 1]
    return kiln.AdamW(lr=lr, weight_decay=0.01, no_weight_decay=no_decay,
                      schedule=kiln.cosine(total_steps=steps, warmup_steps=warmup,
                                           min_lr=lr / 10))


def sample(session, prompt_ids, count):
    """Greedy continuation: `count` argmax characters after `prompt_ids`, each
    from one Run of the forward graph over the session's trained weights (the
    last SEQ characters as context; the causal mask makes the padding after
    them irrelevant)."""
    ids = list(prompt_ids)
    y = np.zeros((1, SEQ), np.int64)
    for _ in range(count):
        window = ids[-SEQ:]
        x = np.zeros((1, SEQ), np.int64)
        x[0, :len(window)] = window
        logits = session.run({"x": x, "y": y})["logits"]
        ids.append(int(np.argmax(logits[0, len(window) - 1])))
    return ids[len(prompt_ids):]


class Kilnd:
    """A kilnd on 127.0.0.1 with an ephemeral port (for --kilnd)."""

    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="kiln_char_gpt.")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", f"--port_file={port_file}", "--metrics_listen=off",
             f"--cache_dir={self.dir}/cache", "--log_level=warn"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kilnd exited with {self.proc.returncode}")
            try:
                port = int(pathlib.Path(port_file).read_text().strip())
                if port > 0:
                    self.addr = f"127.0.0.1:{port}"
                    return
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("kilnd wrote no port file in 60 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--addr", help="a running kilnd")
    where.add_argument("--kilnd", help="start this kilnd binary for the run")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--prompt", default="This License ")
    ap.add_argument("--sample", type=int, default=120, help="characters to generate")
    args = ap.parse_args()

    import kiln  # the Python client (PYTHONPATH=build/clients/python)

    ids = encode(pathlib.Path(args.text).read_text(encoding="utf-8", errors="replace"))
    server = Kilnd(args.kilnd) if args.kilnd else None
    client = kiln.connect(server.addr if server else args.addr)
    try:
        session = client.train_session(kiln.parse(graph_text()), loss="loss",
                                       params=init_params(args.seed),
                                       optimizer=optimizer(kiln, args.lr, args.steps, args.warmup),
                                       device=args.device)
        print(f"{len(ids)} characters of {args.text}; loss at random: ln({VOCAB}) = "
              f"{math.log(VOCAB):.3f}")
        t0, window = time.monotonic(), []
        for step, b in enumerate(batches(ids, args.batch, args.steps, args.seed + 1), 1):
            window.append(session.step(b))
            if step % args.log_every == 0 or step == args.steps:
                rate = step / (time.monotonic() - t0)
                print(f"step {step}/{args.steps}  loss {np.mean(window):.4f} (mean of the last "
                      f"{len(window)})  lr {session.last.lr:.2e}  {rate:.1f} steps/s", flush=True)
                window = []
        out = sample(session, encode(args.prompt), args.sample)
        print(f"greedy sample after {args.prompt!r}:\n{args.prompt}{decode(out)}")
        session.close()
    finally:
        client.close()
        if server:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
