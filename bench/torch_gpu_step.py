#!/usr/bin/env python3
"""PyTorch side of scripts/gpu-check.sh: torchvision resnet50 on the GPU, channels_last,
torch.autocast (fp16 with a GradScaler, or bf16), SGD(momentum, fused=True), synthetic data
(normal pixels, uniform labels, fixed, as `resnet bench` uses), eager or torch.compile.
One training step = zero_grad, forward + loss under autocast, (scaled) backward, optimizer
step (with the scaler's unscale and inf check for fp16). Prints one JSON line:
  {"system": "pytorch-eager"|"pytorch-compile", "images_per_sec": ..., "device_peak": bytes, ...}
The peak is torch.cuda.max_memory_allocated() over the timed run (PyTorch's own allocator).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn as nn
import torchvision


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--half", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--compile", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpu_step.py: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    dtype = torch.float16 if a.half == "fp16" else torch.bfloat16
    model = torchvision.models.resnet50(num_classes=a.classes).to(dev, memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=a.half == "fp16", init_scale=128.0)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(a.batch, 3, a.size, a.size, generator=g).to(dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, a.classes, (a.batch,), generator=g).to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    run = torch.compile(step) if a.compile else step
    t_compile = time.perf_counter()
    for _ in range(a.warmup):
        run()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t_compile
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({
        "system": "pytorch-compile" if a.compile else "pytorch-eager",
        "model": "resnet50", "half": a.half, "batch": a.batch,
        "median_step_s": med, "images_per_sec": a.batch / med, "steps": len(times),
        "device_peak": torch.cuda.max_memory_allocated(), "warmup_s": warm_s,
        "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(0),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
