"""Measures the heap bytes PyTorch's eager CPU training step holds for a small LLaMA, the figure
train-plan plans for the same step (docs/validation.md, "Against PyTorch eager").

The model is written here to compute what train-plan's LLaMA step computes, op for op (src/train/
model_step.cpp): embedding; per layer an RMSNorm (x * rsqrt(mean(x^2) + eps) * w), q/k/v
projections, rotary positions on halves, grouped-query attention with the scores whole (no kv
heads repeated), the output projection, a second RMSNorm, SiLU(gate) * up, the down projection;
the final norm, the head, cross-entropy on the f32 logits; AdamW one tensor at a time. Every
tensor is float32 on the CPU. It is run under scripts/eager_memory/alloc_count.c (LD_PRELOAD),
which counts the bytes held on the heap: the figure is the most held during the second step,
less what was held before the model was made (the first step makes the optimizer's state).

Usage: LD_PRELOAD=alloc_count.so python3 reference.py CONFIG.json BATCH SEQ REMAT
  REMAT: none (autograd keeps what each op saves) or full (each layer under
  torch.utils.checkpoint, keeping its input only).
Prints one JSON line: {"peak_bytes": ..., "held_bytes": ..., "forward_peak_bytes": ...,
"backward_peak_bytes": ..., "update_peak_bytes": ...}.
"""

import ctypes
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

def load_counter():
    path = os.environ.get("LD_PRELOAD", "")
    try:
        lib = ctypes.CDLL(path)
        for name in ("alloc_count_current", "alloc_count_peak", "alloc_count_reset_peak"):
            getattr(lib, name)
    except (OSError, AttributeError) as e:
        raise SystemExit(f"reference.py: LD_PRELOAD={path!r} is not alloc_count.so (build it "
                         f"from scripts/eager_memory/alloc_count.c; run.sh does): {e}")
    lib.alloc_count_current.restype = ctypes.c_longlong
    lib.alloc_count_peak.restype = ctypes.c_longlong
    return lib


counter = load_counter()


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotary(x, cos, sin):  # x [..., t, dh]; cos, sin [t, dh / 2]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Llama:
    def __init__(self, c):
        self.c = c
        d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
        self.heads, self.kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.dh = c.get("head_dim", d // self.heads)
        self.eps = c.get("rms_norm_eps", 1e-5)
        g = torch.Generator().manual_seed(0)

        def weight(*shape):
            return (torch.randn(*shape, generator=g) * 0.02).requires_grad_()

        self.embed = weight(v, d)
        self.layers = []
        for _ in range(c["num_hidden_layers"]):
            self.layers.append({
                "attn_norm": torch.ones(d, requires_grad=True),
                "q": weight(self.heads * self.dh, d), "k": weight(self.kv * self.dh, d),
                "v": weight(self.kv * self.dh, d), "o": weight(d, self.heads * self.dh),
                "mlp_norm": torch.ones(d, requires_grad=True),
                "gate": weight(f, d), "up": weight(f, d), "down": weight(d, f)})
        self.norm = torch.ones(d, requires_grad=True)
        self.head = weight(v, d)

    def parameters(self):
        out = [self.embed]
        for p in self.layers:
            out += list(p.values())
        return out + [self.norm, self.head]

    def layer(self, p, h, cos, sin, mask):
        b, t, _ = h.shape
        kv, g, dh = self.kv, self.heads // self.kv, self.dh
        x = rms_norm(h, p["attn_norm"], self.eps)
        q = F.linear(x, p["q"]).view(b, t, kv, g, dh).permute(0, 2, 3, 1, 4)  # [b, kv, g, t, dh]
        k = F.linear(x, p["k"]).view(b, t, kv, dh).permute(0, 2, 1, 3)        # [b, kv, t, dh]
        v = F.linear(x, p["v"]).view(b, t, kv, dh).permute(0, 2, 1, 3)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        # The query heads of a group against their key head, without copying the keys.
        scores = torch.matmul(q.reshape(b, kv, g * t, dh), k.transpose(-1, -2))
        scores = scores.view(b, kv, g, t, t) * (1.0 / math.sqrt(dh))
        probs = torch.softmax(torch.where(mask, scores, torch.full_like(scores, -1e30)), -1)
        out = torch.matmul(probs.view(b, kv, g * t, t), v).view(b, kv, g, t, dh)
        merged = out.permute(0, 3, 1, 2, 4).reshape(b, t, self.heads * dh)
        h2 = h + F.linear(merged, p["o"])
        x2 = rms_norm(h2, p["mlp_norm"], self.eps)
        inner = F.silu(F.linear(x2, p["gate"])) * F.linear(x2, p["up"])
        return h2 + F.linear(inner, p["down"])

    def loss(self, tokens, targets, remat):
        t = tokens.shape[1]
        half = self.dh // 2
        angle = torch.arange(t, dtype=torch.float32)[:, None] * torch.exp(
            torch.arange(half, dtype=torch.float32) * (-2.0 * math.log(10000.0) / self.dh))
        cos, sin = torch.cos(angle), torch.sin(angle)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        h = F.embedding(tokens, self.embed)
        for p in self.layers:
            if remat == "full":
                h = checkpoint(lambda hh, p=p: self.layer(p, hh, cos, sin, mask), h,
                               use_reentrant=False)
            else:
                h = self.layer(p, h, cos, sin, mask)
        logits = F.linear(rms_norm(h, self.norm, self.eps), self.head)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def main():
    config_path, batch, seq, remat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if remat not in ("none", "full"):
        raise SystemExit(f"REMAT must be none or full, got {remat!r}")
    with open(config_path) as f:
        config = json.load(f)
    torch.set_num_threads(1)
    before = counter.alloc_count_current()
    model = Llama(config)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config["vocab_size"], (batch, seq), generator=gen)
    targets = torch.randint(0, config["vocab_size"], (batch, seq), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)

    def step(record):
        counter.alloc_count_reset_peak()
        loss = model.loss(tokens, targets, remat)
        record["forward_peak_bytes"] = counter.alloc_count_peak() - before
        counter.alloc_count_reset_peak()
        loss.backward()
        del loss
        record["backward_peak_bytes"] = counter.alloc_count_peak() - before
        counter.alloc_count_reset_peak()
        opt.step()
        opt.zero_grad(set_to_none=True)
        record["update_peak_bytes"] = counter.alloc_count_peak() - before

    step({})  # makes the optimizer's state
    record = {"held_bytes": counter.alloc_count_current() - before}
    step(record)
    record["peak_bytes"] = max(record[k] for k in
                               ("forward_peak_bytes", "backward_peak_bytes", "update_peak_bytes"))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
