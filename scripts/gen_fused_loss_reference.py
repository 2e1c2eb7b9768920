#!/usr/bin/env python3
"""Writes tests/data/fused_loss_reference.txt: PyTorch's cross-entropy of the logits h @ w^T
(torch.nn.functional.cross_entropy, reduction "none") and its autograd gradients with respect to
h and w, in float64, on small fixed inputs, which tests/fused_loss_test.cpp compares
linear_cross_entropy with (f64 to 1e-12, f32 at float32 rounding). Inputs are a formula of the
flat index, so that the C++ test rebuilds them: h, w element i = sin(a * i + c); label of token i
= (7 i + 3) mod vocab; the loss differentiated is sum(l * (1 + 0.25 t)) for token position t.

Usage: /usr/bin/python3 scripts/gen_fused_loss_reference.py   (apt-get install python3-torch)
The test does not need torch: the generated file is committed.
"""
import os

import torch

from torch_reference import formula, write

# name, B, T, D, V
CASES = [("small", 2, 12, 8, 40), ("odd", 1, 9, 5, 13)]
COEF = {"h": (0.37, 0.11), "w": (0.53, -0.2)}




def main():
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "fused_loss_reference.txt")
    with open(path, "w") as out:
        out.write(f"# scripts/gen_fused_loss_reference.py, torch {torch.__version__}, float64\n")
        for name, b, t, d, v in CASES:
            h = formula((b, t, d), *COEF["h"]).requires_grad_()
            w = formula((v, d), *COEF["w"]).requires_grad_()
            labels = torch.tensor([(7 * i + 3) % v for i in range(b * t)]).reshape(b, t)
            logits = torch.matmul(h, w.t())
            loss = torch.nn.functional.cross_entropy(logits.reshape(b * t, v), labels.reshape(-1),
                                                     reduction="none").reshape(b, t)
            weight = 1.0 + 0.25 * torch.arange(t, dtype=torch.float64)
            (loss * weight).sum().backward()
            out.write(f"case {name}\n")
            write(out, "loss", loss.detach())
            write(out, "dh", h.grad)
            write(out, "dw", w.grad)


if __name__ == "__main__":
    main()
