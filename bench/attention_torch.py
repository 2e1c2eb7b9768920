#!/usr/bin/env python3
"""PyTorch's attention at bench/attention_bench.cpp's sizes, for comparison: softmax(Q K^T * scale
+ causal mask) V, forward and backward (the gradient of sum(o * w) with respect to q, k and v),
B = 1, T = S = 2048, 16 heads of 64, f32, on 2 threads. PyTorch 1.13 (Debian's python3-torch) has no
fused CPU kernel for scaled_dot_product_attention, so this is what it runs. Prints the median of
the timed runs in ms.

Usage: python3 bench/attention_torch.py [runs]   (apt-get install python3-torch libopenblas0-pthread)
"""
import math
import statistics
import sys
import time

import torch

T, HEADS, HEAD = 2048, 16, 64


def step(q, k, v, w, mask):
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(HEAD)) + mask
    o = torch.matmul(torch.softmax(s, dim=-1), v)
    (o * w).sum().backward()


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    torch.set_num_threads(2)
    torch.manual_seed(0)
    shape = (1, HEADS, T, HEAD)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    w = torch.randn(shape)
    mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    step(q, k, v, w, mask)  # warm up
    times = []
    for _ in range(runs):
        for x in (q, k, v):
            x.grad = None
        start = time.perf_counter()
        step(q, k, v, w, mask)
        times.append((time.perf_counter() - start) * 1e3)
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} "
          f"forward+backward median {statistics.median(times):.1f} ms over {runs} runs")


if __name__ == "__main__":
    main()
