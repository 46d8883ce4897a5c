#!/usr/bin/python3
"""PyTorch side of bench/fashion_mnist.sh: the default resnet.cpp recipe, same model (the CIFAR
ResNet-20 of tools/golden.py, torchvision BasicBlocks), batch 128, 5 epochs, random crop with
padding 2 and horizontal flip, normalisation (0.2860, 0.3530), SGD momentum 0.9, weight decay
5e-4 on conv/linear weights only, peak lr 0.2 x 128 / 256, one epoch of linear warmup from 10%
then cosine to 0 (per step), channels_last, the given thread count. Augmentation is done on
whole batches with tensor ops (the fastest way PyTorch offers without extra processes).
Prints per-epoch wall time (training plus test-set evaluation, like resnet.cpp's epochs) and
the final test accuracy, and one summary line:
  torch epochs=5 seconds_per_epoch=<median> total_seconds=<t> top1=<acc>
"""
import argparse
import gzip
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from golden import CifarResNet  # noqa: E402


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr = torch.from_numpy(read_idx(f"{a.root}/train-images-idx3-ubyte.gz").copy()).float().div_(255).unsqueeze(1)
    ytr = torch.from_numpy(read_idx(f"{a.root}/train-labels-idx1-ubyte.gz").astype(np.int64))
    xte = torch.from_numpy(read_idx(f"{a.root}/t10k-images-idx3-ubyte.gz").copy()).float().div_(255).unsqueeze(1)
    yte = torch.from_numpy(read_idx(f"{a.root}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    xtr = (xtr - 0.2860) / 0.3530
    xte = (xte - 0.2860) / 0.3530

    model = CifarResNet(20, 1, 10).to(memory_format=torch.channels_last)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    peak = 0.2 * a.batch / 256
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0}],
                          lr=peak, momentum=0.9)
    steps_per_epoch = len(xtr) // a.batch
    total, warm = a.epochs * steps_per_epoch, steps_per_epoch

    def lr_at(step):
        if step < warm:
            return peak * (0.1 + 0.9 * step / warm)
        t = min(1.0, (step - warm) / (total - warm))
        return peak * (1 + math.cos(math.pi * t)) / 2

    loss_fn = nn.CrossEntropyLoss()
    step = 0
    epoch_times = []
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(len(xtr))
        for b in range(steps_per_epoch):
            idx = perm[b * a.batch:(b + 1) * a.batch]
            x = nn.functional.pad(xtr[idx], (2, 2, 2, 2))
            dy, dx = torch.randint(0, 5, (2,)).tolist()  # one crop offset per batch keeps it vectorised
            x = x[:, :, dy:dy + 28, dx:dx + 28]
            flip = torch.rand(a.batch) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x).contiguous(memory_format=torch.channels_last)
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), ytr[idx])
            loss.backward()
            opt.step()
            step += 1
        model.eval()
        correct = 0
        with torch.no_grad():
            for b in range(0, len(xte), 500):
                correct += (model(xte[b:b + 500].contiguous(memory_format=torch.channels_last)).argmax(1)
                            == yte[b:b + 500]).sum().item()
        epoch_times.append(time.perf_counter() - t0)  # training and evaluation, as resnet.cpp's epoch
        print(f"torch epoch {epoch + 1}: {epoch_times[-1]:.1f} s, loss {loss.item():.4f}, test top-1 "
              f"{100 * correct / len(xte):.2f}%", flush=True)
    print(f"torch epochs={a.epochs} seconds_per_epoch={statistics.median(epoch_times):.2f} "
          f"total_seconds={sum(epoch_times):.1f} top1={correct / len(xte):.4f}")


if __name__ == "__main__":
    main()
