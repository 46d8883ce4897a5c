#!/usr/bin/python3
"""PyTorch side of bench/cpu_step.sh: torchvision model, channels_last, synthetic data,
one training step = forward, cross-entropy, backward, SGD(momentum) step. Prints one line:
  torch <model> <dtype> batch=<B> img/s=<median over timed steps> steps=<n>
bf16 uses torch.autocast(cpu, bfloat16), PyTorch's recommended CPU mixed precision.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torchvision

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from golden import build  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build(a.model, a.channels, a.classes).to(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(a.batch, a.channels, a.size, a.size).to(memory_format=torch.channels_last)
    y = torch.randint(0, a.classes, (a.batch,))
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"torch {a.model} {a.dtype} batch={a.batch} img/s={a.batch / med:.2f} steps={len(times)} "
          f"threads={torch.get_num_threads()}")


if __name__ == "__main__":
    main()
