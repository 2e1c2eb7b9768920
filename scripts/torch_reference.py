"""What scripts/gen_attention_reference.py and gen_fused_loss_reference.py share: the inputs'
formula (sin(a * i + c) of the flat index, rebuilt by tests/torch_reference.hpp) and the file
format (a "name d0 d1 ..." line, then a line of the values, row-major)."""
import math

import torch


def formula(shape, a, c):
    n = math.prod(shape)
    return torch.tensor([math.sin(a * i + c) for i in range(n)], dtype=torch.float64).reshape(shape)


def write(out, name, x):
    out.write(f"{name} {' '.join(str(d) for d in x.shape)}\n")
    out.write(" ".join(repr(float(v)) for v in x.reshape(-1).tolist()) + "\n")
