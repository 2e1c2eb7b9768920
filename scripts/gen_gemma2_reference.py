#!/usr/bin/env python3
"""Writes tests/data/gemma2_reference.txt: a tiny Gemma 2's mean next-token cross-entropy and its
gradients with respect to the (tied) embedding and layer 0's q_proj, computed by PyTorch in
float64 with plain tensor ops written from transformers' Gemma2 modeling code as documented
(Gemma2RMSNorm's (1 + weight), the embeddings times sqrt(hidden_size), scores scaled by
query_pre_attn_scalar ** -0.5 and soft-capped before the mask, sliding-window attention on the
even layers, pre- and post-norms around attention and the MLP, GeGLU with the tanh gelu, the final
logits soft-capped), which tests/gemma2_family_test.cpp compares the planner's step with. Four
cases: the model as configured, and without each of its features (the attention cap, the final
cap, the window), so that the test shows each one changes the loss.

Weights are a formula the C++ test rebuilds: parameter k of the names sorted (checkpoint names,
'.' as '/') has element i = 0.5 sin((0.37 + 0.07 k) i + 0.3 k); token i of the flat batch is
(7 i + 3) mod vocab, its target (5 i + 1) mod vocab.

Usage: /usr/bin/python3 scripts/gen_gemma2_reference.py   (apt-get install python3-torch)
The test does not need torch: the generated file is committed.
"""
import math
import os

import torch
import torch.nn.functional as F

from torch_reference import write

# The tiny config (the test parses the same fields): head_dim 8, not hidden / heads = 4; a scale
# base of 12, not head_dim; a window of 3 tokens on layer 0 of a sequence of 8.
CFG = dict(vocab=40, hidden=16, heads=4, kv=2, dh=8, inter=24, layers=2, scalar=12.0,
           window=3, attn_cap=1.0, final_cap=3.0)
B, T = 2, 8
CASES = [("gemma2", {}), ("no_attention_cap", {"attn_cap": 0}), ("no_final_cap", {"final_cap": 0}),
         ("no_window", {"window": 0})]


def names(c):
    out = ["model/embed_tokens/weight", "model/norm/weight"]
    q, kv, d, m = c["heads"] * c["dh"], c["kv"] * c["dh"], c["hidden"], c["inter"]
    for l in range(c["layers"]):
        p = f"model/layers/{l}/"
        out += [p + "input_layernorm/weight", p + "post_attention_layernorm/weight",
                p + "pre_feedforward_layernorm/weight", p + "post_feedforward_layernorm/weight",
                p + "self_attn/q_proj/weight", p + "self_attn/k_proj/weight",
                p + "self_attn/v_proj/weight", p + "self_attn/o_proj/weight",
                p + "mlp/gate_proj/weight", p + "mlp/up_proj/weight", p + "mlp/down_proj/weight"]
    shapes = {"embed_tokens": (c["vocab"], d), "norm": (d,), "layernorm": (d,), "q_proj": (q, d),
              "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, q), "gate_proj": (m, d),
              "up_proj": (m, d), "down_proj": (d, m)}
    return {n: next(s for key, s in shapes.items() if n.split("/")[-2].endswith(key)) for n in out}


def weights(c):
    params = {}
    for k, (name, shape) in enumerate(sorted(names(c).items())):
        n = math.prod(shape)
        a, ph = 0.37 + 0.07 * k, 0.3 * k
        params[name] = torch.tensor([0.5 * math.sin(a * i + ph) for i in range(n)],
                                    dtype=torch.float64).reshape(shape).requires_grad_()
    return params


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w)


def rotary(x):  # [b, heads, t, dh], rotate-half, base 10000
    t, dh = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh))
    angle = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    half = dh // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def cap(x, c):
    return c * torch.tanh(x / c) if c > 0 else x


def loss_of(c, P, ids, targets):
    H, KV, dh = c["heads"], c["kv"], c["dh"]
    h = P["model/embed_tokens/weight"][ids] * math.sqrt(c["hidden"])
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    for l in range(c["layers"]):
        w = lambda n: P[f"model/layers/{l}/{n}"]
        x = rms_norm(h, w("input_layernorm/weight"))
        q = (x @ w("self_attn/q_proj/weight").T).view(B, T, H, dh).transpose(1, 2)
        k = (x @ w("self_attn/k_proj/weight").T).view(B, T, KV, dh).transpose(1, 2)
        v = (x @ w("self_attn/v_proj/weight").T).view(B, T, KV, dh).transpose(1, 2)
        q, k = rotary(q), rotary(k)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        scores = cap(q @ k.transpose(-1, -2) * c["scalar"] ** -0.5, c["attn_cap"])
        allowed = j <= i
        if l % 2 == 0 and c["window"] > 0:
            allowed = allowed & (i - j < c["window"])
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
        o = (probs @ v).transpose(1, 2).reshape(B, T, H * dh) @ w("self_attn/o_proj/weight").T
        h = h + rms_norm(o, w("post_attention_layernorm/weight"))
        x = rms_norm(h, w("pre_feedforward_layernorm/weight"))
        gate = F.gelu(x @ w("mlp/gate_proj/weight").T, approximate="tanh")
        m = (gate * (x @ w("mlp/up_proj/weight").T)) @ w("mlp/down_proj/weight").T
        h = h + rms_norm(m, w("post_feedforward_layernorm/weight"))
    logits = cap(rms_norm(h, P["model/norm/weight"]) @ P["model/embed_tokens/weight"].T,
                 c["final_cap"])
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1)), scores, logits


def main():
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "gemma2_reference.txt")
    ids = torch.tensor([(7 * i + 3) % CFG["vocab"] for i in range(B * T)]).reshape(B, T)
    targets = torch.tensor([(5 * i + 1) % CFG["vocab"] for i in range(B * T)]).reshape(B, T)
    with open(path, "w") as out:
        out.write(f"# scripts/gen_gemma2_reference.py, torch {torch.__version__}, float64\n")
        for name, change in CASES:
            c = dict(CFG, **change)
            P = weights(c)
            loss, scores, logits = loss_of(c, P, ids, targets)
            loss.backward()
            out.write(f"# {name}: largest |score| {scores.abs().max().item():.3g} (last layer), "
                      f"|logit| {logits.abs().max().item():.3g}\n")
            out.write(f"case {name}\n")
            write(out, "loss", loss.detach().reshape(1))
            write(out, "d_embed", P["model/embed_tokens/weight"].grad)
            write(out, "d_q0", P["model/layers/0/self_attn/q_proj/weight"].grad)


if __name__ == "__main__":
    main()
