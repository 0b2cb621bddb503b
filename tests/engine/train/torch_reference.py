#!/usr/bin/python3
"""Reference values for Kiln's training tests (tests/engine/train/, tests/server/).

Reads one JSON request from argv[1] and prints one JSON answer on stdout.

  {"mode": "optimizer", ...}: params and gradients drawn from a seeded NumPy
    generator, stepped `steps` times by torch.optim (sgd, adam, adamw) or by the
    NumPy references below (lion: Chen et al. 2023, "Symbolic Discovery of
    Optimization Algorithms", as lucidrains/lion-pytorch; muon: K. Jordan 2024,
    github.com/KellerJordan/Muon, AdamW for params that are not matrices).
    Answers the initial params, each step's gradients and the params after each step.
  {"mode": "mlp", ...}: an MLP (tanh hidden layers, softmax cross-entropy) with
    seeded initial weights and batches trained in PyTorch; answers the initial
    weights, the batches and the loss of each step.
  {"mode": "cnn", ...}: the same for a small CNN (conv, relu, max pool, linear).

Runs with Debian's /usr/bin/python3 (torch 1.13, NumPy), one thread.
"""
import json
import math
import sys

import numpy as np
import torch

torch.set_num_threads(1)


def schedule_factor(s, t):
    """Kiln's LR factor for the t-th step (1-based); train.proto LrSchedule."""
    kind = s.get("kind", "constant")
    w = s.get("warmup_steps", 0)
    if kind == "linear_warmup":
        return 1.0 if w == 0 else min(1.0, t / w)
    if kind == "cosine":
        total, min_lr, lr = s["total_steps"], s.get("min_lr", 0.0), s["lr"]
        if w > 0 and t <= w:
            return t / w
        progress = min(1.0, max(0.0, (t - w) / (total - w)))
        return (min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))) / lr
    return 1.0


def newton_schulz(g, steps):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (np.linalg.norm(g) + 1e-7)
    tall = g.shape[0] > g.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        A = x @ x.T
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x.T if tall else x


def numpy_step(req, params, grads, state, t):
    kind = req["kind"]
    lr = req["lr"] * schedule_factor(dict(req.get("schedule", {}), lr=req["lr"]), t)
    no_decay = set(req.get("no_weight_decay", []))
    for name, p in params.items():
        g = grads[name]
        wd = 0.0 if name in no_decay else req.get("weight_decay", 0.0)
        st = state.setdefault(name, {})
        if kind == "lion":
            b1, b2 = req.get("beta1", 0.9), req.get("beta2", 0.99)
            m = st.get("m", np.zeros_like(p))
            p = p * (1 - lr * wd)
            p = p - lr * np.sign(b1 * m + (1 - b1) * g)
            st["m"] = b2 * m + (1 - b2) * g
        elif kind == "muon" and p.ndim == 2:
            mom, nesterov = req.get("momentum", 0.95), req.get("muon_nesterov", True)
            mlr = req.get("muon_lr", req["lr"]) * (lr / req["lr"])
            buf = mom * st.get("buf", np.zeros_like(p)) + (1 - mom) * g
            st["buf"] = buf
            u = (1 - mom) * g + mom * buf if nesterov else buf
            o = newton_schulz(u, req.get("ns_steps", 5))
            p = p * (1 - mlr * wd) - mlr * math.sqrt(max(1.0, p.shape[0] / p.shape[1])) * o
        else:  # muon's AdamW part
            b1, b2, eps = req.get("beta1", 0.9), req.get("beta2", 0.999), req.get("epsilon", 1e-8)
            m = b1 * st.get("m", np.zeros_like(p)) + (1 - b1) * g
            v = b2 * st.get("v", np.zeros_like(p)) + (1 - b2) * g * g
            st["m"], st["v"] = m, v
            p = p * (1 - lr * wd)
            denom = np.sqrt(v) / math.sqrt(1 - b2 ** t) + eps
            p = p - lr / (1 - b1 ** t) * m / denom
        params[name] = p


def torch_optimizer(req, tensors):
    kind = req["kind"]
    no_decay = set(req.get("no_weight_decay", []))
    wd = req.get("weight_decay", 0.01 if kind == "adamw" else 0.0)
    groups = [{"params": [t for n, t in tensors.items() if n not in no_decay], "weight_decay": wd},
              {"params": [t for n, t in tensors.items() if n in no_decay], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=req["lr"], momentum=req.get("momentum", 0.0),
                               dampening=req.get("dampening", 0.0),
                               nesterov=req.get("nesterov", False))
    betas = (req.get("beta1", 0.9), req.get("beta2", 0.999))
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return cls(groups, lr=req["lr"], betas=betas, eps=req.get("epsilon", 1e-8))


def optimizer(req):
    rng = np.random.default_rng(req.get("seed", 0))
    dtype = np.float32
    shapes = req["shapes"]
    init = {n: rng.uniform(-1, 1, size=s).astype(dtype) for n, s in shapes.items()}
    grads = [{n: rng.normal(0, 1, size=s).astype(dtype) for n, s in shapes.items()}
             for _ in range(req["steps"])]
    out = {"init": {n: v.ravel().tolist() for n, v in init.items()},
           "grads": [{n: v.ravel().tolist() for n, v in g.items()} for g in grads], "params": []}
    if req["kind"] in ("lion", "muon"):
        params = {n: v.astype(np.float64) for n, v in init.items()}
        state = {}
        for t, g in enumerate(grads, 1):
            g64 = {n: v.astype(np.float64) for n, v in g.items()}
            if req.get("max_grad_norm", 0) > 0:
                norm = math.sqrt(sum(float((v * v).sum()) for v in g64.values()))
                coef = min(1.0, req["max_grad_norm"] / (norm + 1e-6))
                g64 = {n: v * coef for n, v in g64.items()}
            numpy_step(req, params, g64, state, t)
            out["params"].append({n: v.ravel().tolist() for n, v in params.items()})
        return out
    tensors = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
    opt = torch_optimizer(req, tensors)
    sched = dict(req.get("schedule", {}), lr=req["lr"])
    lam = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: schedule_factor(sched, s + 1))
    for g in grads:
        for n, t in tensors.items():
            t.grad = torch.tensor(g[n])
        if req.get("max_grad_norm", 0) > 0:
            torch.nn.utils.clip_grad_norm_(list(tensors.values()), req["max_grad_norm"])
        opt.step()
        lam.step()
        out["params"].append({n: t.detach().numpy().ravel().tolist() for n, t in tensors.items()})
    return out


def mlp(req):
    rng = np.random.default_rng(req.get("seed", 0))
    sizes = req["sizes"]  # e.g. [8, 16, 4]
    params = {}
    for i in range(len(sizes) - 1):
        bound = 1 / math.sqrt(sizes[i])
        params[f"w{i + 1}"] = rng.uniform(-bound, bound, size=(sizes[i], sizes[i + 1])).astype(np.float32)
        params[f"b{i + 1}"] = rng.uniform(-bound, bound, size=(sizes[i + 1],)).astype(np.float32)
    batches = []
    for _ in range(req["steps"]):
        x = rng.normal(0, 1, size=(req["batch"], sizes[0])).astype(np.float32)
        y = rng.integers(0, sizes[-1], size=(req["batch"],)).astype(np.int64)
        batches.append((x, y))
    tensors = {n: torch.tensor(v, requires_grad=True) for n, v in params.items()}
    opt = torch_optimizer(req, tensors)
    losses = []
    for x, y in batches:
        h = torch.tensor(x)
        layers = len(sizes) - 1
        for i in range(layers):
            h = h @ tensors[f"w{i + 1}"] + tensors[f"b{i + 1}"]
            if i + 1 < layers:
                h = torch.tanh(h)
        loss = torch.nn.functional.cross_entropy(h, torch.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return {"init": {n: v.ravel().tolist() for n, v in params.items()},
            "batches": [{"x": x.ravel().tolist(), "y": y.tolist()} for x, y in batches],
            "losses": losses,
            "final": {n: t.detach().numpy().ravel().tolist() for n, t in tensors.items()}}


def cnn(req):
    """conv 3x3 (pad 1) -> relu -> 2x2 max pool -> linear -> cross-entropy, on
    [batch, 1, 8, 8] images with `classes` classes."""
    rng = np.random.default_rng(req.get("seed", 0))
    ch, classes, batch = req["channels"], req["classes"], req["batch"]
    params = {
        "cw": rng.uniform(-1 / 3, 1 / 3, size=(ch, 1, 3, 3)).astype(np.float32),
        "cb": rng.uniform(-1 / 3, 1 / 3, size=(ch,)).astype(np.float32),
        "fw": rng.uniform(-0.2, 0.2, size=(ch * 16, classes)).astype(np.float32),
        "fb": rng.uniform(-0.2, 0.2, size=(classes,)).astype(np.float32),
    }
    batches = []
    for _ in range(req["steps"]):
        x = rng.normal(0, 1, size=(batch, 1, 8, 8)).astype(np.float32)
        y = rng.integers(0, classes, size=(batch,)).astype(np.int64)
        batches.append((x, y))
    tensors = {n: torch.tensor(v, requires_grad=True) for n, v in params.items()}
    opt = torch_optimizer(req, tensors)
    losses = []
    for x, y in batches:
        h = torch.nn.functional.conv2d(torch.tensor(x), tensors["cw"], tensors["cb"], padding=1)
        h = torch.nn.functional.max_pool2d(torch.relu(h), 2)
        logits = h.reshape(batch, -1) @ tensors["fw"] + tensors["fb"]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return {"init": {n: v.ravel().tolist() for n, v in params.items()},
            "batches": [{"x": x.ravel().tolist(), "y": y.tolist()} for x, y in batches],
            "losses": losses,
            "final": {n: t.detach().numpy().ravel().tolist() for n, t in tensors.items()}}


def main():
    req = json.loads(sys.argv[1])
    modes = {"optimizer": optimizer, "mlp": mlp, "cnn": cnn}
    answer = modes[req["mode"]](req)
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
