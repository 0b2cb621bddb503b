"""The model of char_gpt.kiln in PyTorch, op for op, over a dict of tensors named
as the graph's params: the peer of Kiln's training in
tests/clients/python_char_gpt_test.py (Debian's torch 1.13, CPU) and in the
GPU step benchmark bench/gpu/torch_train_gpt.py (PyTorch 2.11, CUDA). Plain
ops only (no scaled_dot_product_attention, which 1.13 lacks), so both
versions compute the same thing.
"""
import math

import torch
import torch.nn.functional as F

from char_gpt import D_MODEL, HEADS, LAYERS, SEQ, VOCAB


def forward(p, x):
    """Logits [B, SEQ, VOCAB] for tokens x [B, SEQ] (int64)."""
    b = x.shape[0]
    dh = D_MODEL // HEADS
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool, device=x.device).triu(1)
    h = p["wte"][x] + p["wpe"]
    for layer in range(LAYERS):
        w = {n[len(f"l{layer}_"):]: t for n, t in p.items() if n.startswith(f"l{layer}_")}
        a = F.layer_norm(h, (D_MODEL,), w["ln1_g"], w["ln1_b"], 1e-5)

        def heads(t):
            return t.reshape(b, SEQ, HEADS, dh).transpose(1, 2)

        q, k, v = (heads(a @ w["w" + c] + w["b" + c]) for c in "qkv")
        s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(dh))
        att = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        h = h + att.transpose(1, 2).reshape(b, SEQ, D_MODEL) @ w["wo"] + w["bo"]
        m = F.layer_norm(h, (D_MODEL,), w["ln2_g"], w["ln2_b"], 1e-5)
        h = h + F.gelu(m @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]
    return F.layer_norm(h, (D_MODEL,), p["lnf_g"], p["lnf_b"], 1e-5) @ p["w_head"]


def loss_fn(p, x, y):
    return F.cross_entropy(forward(p, x).reshape(-1, VOCAB), y.reshape(-1))


def adamw(p, lr, weight_decay=0.01):
    """torch.optim.AdamW with char_gpt.optimizer's decay mask (none on vectors)."""
    decay = [t for t in p.values() if t.dim() > 1]
    rest = [t for t in p.values() if t.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr)
