#!/usr/bin/env python3
"""Writes tests/data/attention_reference.txt: PyTorch's attention outputs and autograd gradients in
float64 on small fixed inputs, which tests/attention_test.cpp compares dot_product_attention with
(f64 to 1e-12, f32 at float32 rounding). The inputs are a formula of the flat index, so that the
C++ test rebuilds them: q, k, v, bias element i = sin(a * i + c) (a, c per tensor below), and the
cotangent w of the output (the loss is sum(o * w)) = cos(0.29 * i).

PyTorch 1.13 (Debian's python3-torch) has no torch.nn.functional.scaled_dot_product_attention
(added in 2.0), so the reference is its documented math: softmax(Q K^T * scale + bias, with -inf
where the mask is false or a key lies after the query) V, grouped-query heads repeated with
repeat_interleave, in float64 with torch's autograd.

Usage: /usr/bin/python3 scripts/gen_attention_reference.py   (apt-get install python3-torch)
The test does not need torch: the generated file is committed.
"""
import math
import os

import torch

from torch_reference import formula, write

# name, B, T, N, S, K, H, causal, with mask, with bias, scale (None: 1/sqrt(H))
CASES = [
    ("causal_gqa", 2, 5, 4, 7, 2, 3, True, False, False, None),
    ("mask_bias_scale", 2, 5, 4, 7, 2, 3, False, True, True, 0.4),
]
COEF = {"q": (0.37, 0.11), "k": (0.53, -0.2), "v": (0.71, 0.3), "bias": (0.23, 0.05)}



def mask_of(t, s):
    # key 0 always allowed; key j of query i dropped when (i * s + j) * 7 % 3 == 0
    m = torch.ones(t, s, dtype=torch.bool)
    for i in range(t):
        for j in range(1, s):
            m[i, j] = ((i * s + j) * 7) % 3 != 0
    return m


def attention(q, k, v, bias, mask, causal, scale):
    n, kv = q.shape[2], k.shape[2]
    qt = q.transpose(1, 2)  # [B, N, T, H]
    kt = k.transpose(1, 2).repeat_interleave(n // kv, dim=1)
    vt = v.transpose(1, 2).repeat_interleave(n // kv, dim=1)
    s = torch.matmul(qt, kt.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    t, sk = s.shape[-2], s.shape[-1]
    allowed = torch.ones(t, sk, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if causal:
        allowed = allowed & torch.tril(torch.ones(t, sk, dtype=torch.bool))
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), vt).transpose(1, 2)



def main():
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "attention_reference.txt")
    with open(path, "w") as out:
        out.write(f"# scripts/gen_attention_reference.py, torch {torch.__version__}, float64\n")
        for name, b, t, n, s, kv, h, causal, with_mask, with_bias, scale in CASES:
            q = formula((b, t, n, h), *COEF["q"]).requires_grad_()
            k = formula((b, s, kv, h), *COEF["k"]).requires_grad_()
            v = formula((b, s, kv, h), *COEF["v"]).requires_grad_()
            bias = formula((1, n, t, s), *COEF["bias"]).requires_grad_() if with_bias else None
            mask = mask_of(t, s) if with_mask else None
            sc = scale if scale is not None else 1 / math.sqrt(h)
            o = attention(q, k, v, bias, mask, causal, sc)
            w = torch.tensor([math.cos(0.29 * i) for i in range(o.numel())],
                             dtype=torch.float64).reshape(o.shape)
            (o * w).sum().backward()
            out.write(f"case {name}\n")
            write(out, "o", o.detach())
            write(out, "dq", q.grad)
            write(out, "dk", k.grad)
            write(out, "dv", v.grad)
            if bias is not None:
                write(out, "dbias", bias.grad)


if __name__ == "__main__":
    main()
