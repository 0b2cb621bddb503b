#!/usr/bin/env python3
"""PyTorch SDPA (CUDA, bf16; f32 with TF32 off) on attention_fwd's cases, as the peer for
Kiln's attention kernels: F.scaled_dot_product_attention with PyTorch's own
backend choice (cuDNN / FlashAttention), CUDA events, medians of timed
batches after warm-up. One JSON line per case, named as attention_fwd's.

usage: torch_attention.py [--reps 10] [--rounds 7] [--cases all|big|decode|f32]
"""
import argparse
import json

import torch
import torch.nn.functional as F

CASES = [
    ("causal_B4_H32_S2048_D128", 4, 32, 32, 2048, 2048, 128, True, "big"),
    ("full_B4_H32_S4096_D128", 4, 32, 32, 4096, 4096, 128, False, "big"),
    ("full_B16_H16_S2048_D64", 16, 16, 16, 2048, 2048, 64, False, "big"),
    # The bf16 BERT-base layer's attention and the decoder layer's with grouped KV heads.
    ("bert_bf16_B32_H12_S512_D64", 32, 12, 12, 512, 512, 64, False, "big"),
    ("gqa_causal_B4_H32_KV8_S2048_D128", 4, 32, 8, 2048, 2048, 128, True, "big"),
    ("decode_B8_H32_KV8_S1_Sk8192_D128", 8, 32, 8, 1, 8192, 128, True, "decode"),
    ("decode_B1_H32_S1_Sk32768_D128", 1, 32, 32, 1, 32768, 128, True, "decode"),
    ("decode_B4_H32_KV4_S1_Sk16384_D128", 4, 32, 4, 1, 16384, 128, True, "decode"),
    # f32 (TF32 off), as Kiln's f32 layer runs it.
    ("bert_f32_B8_H12_S128_D64", 8, 12, 12, 128, 128, 64, False, "f32"),
    ("f32_B4_H16_S512_D64", 4, 16, 16, 512, 512, 64, False, "f32"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cases", default="all")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for name, b, hq, hkv, sq, sk, d, causal, kind in CASES:
        if args.cases not in ("all", kind):
            continue
        dt = torch.float32 if kind == "f32" else torch.bfloat16
        q = torch.rand(b, hq, sq, d, device=dev, dtype=dt) * 2 - 1
        k = torch.rand(b, hkv, sk, d, device=dev, dtype=dt) * 2 - 1
        v = torch.rand(b, hkv, sk, d, device=dev, dtype=dt) * 2 - 1
        # A causal single query row over the whole cache sees every key: no mask.
        is_causal = causal and sq == sk

        def run():
            # GQA as the kernels see it: each kv head serves Hq / Hkv query heads.
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                  enable_gqa=hkv != hq)

        for _ in range(3):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.rounds):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(args.reps):
                run()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / args.reps)
        times.sort()
        ms = times[len(times) // 2]
        flops = 4.0 * b * hq * sq * sk * d / (2 if is_causal else 1)
        row = {"bench": "attention_fwd", "impl": "torch_sdpa", "case": name, "ms": ms,
               "tflops": flops / (ms * 1e-3) / 1e12, "torch": torch.__version__}
        if sq == 1:
            row["kv_gbps"] = 2.0 * b * hkv * sk * d * q.element_size() / (ms * 1e-3) / 1e9
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
