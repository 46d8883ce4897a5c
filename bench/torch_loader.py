#!/usr/bin/python3
"""PyTorch's side of bench/loader.sh: torchvision's ImageFolder (PIL decode) with
RandomResizedCrop(224) + RandomHorizontalFlip, through torch.utils.data.DataLoader with N
worker processes, batches of uint8 tensors (PILToTensor) or, with --normalize, float
tensors (ToTensor + Normalize). Prints one JSON line: images/s and images/s per worker.

  torch_loader.py FOLDER [--workers 2] [--batch 256] [--warmup 2] [--normalize] [--eval]
"""
import argparse
import json
import time

import torch
import torchvision
from torchvision import transforms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--normalize", action="store_true")
    p.add_argument("--eval", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.eval:
        t = [transforms.Resize(256), transforms.CenterCrop(224)]
    else:
        t = [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()]
    if a.normalize:
        t += [transforms.ToTensor(), transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    else:
        t += [transforms.PILToTensor()]
    ds = torchvision.datasets.ImageFolder(a.folder, transform=transforms.Compose(t))
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                                         drop_last=True, persistent_workers=False, prefetch_factor=2)
    # As resnet.cpp's `bench --data`: the clock starts when the warm-up batches have been
    # taken; the batches the workers had made or begun by then (prefetch_factor per worker)
    # are taken but not counted, so every counted batch was begun after the clock started.
    prefetched = 2 * max(a.workers, 1)
    images = 0
    t0 = time.perf_counter()
    for k, (x, y) in enumerate(loader, start=1):
        if k == a.warmup:
            t0 = time.perf_counter()
        elif k > a.warmup + prefetched:
            images += x.shape[0]
    seconds = time.perf_counter() - t0
    rate = images / seconds
    print(json.dumps({"system": "pytorch", "torch": torch.__version__, "torchvision": torchvision.__version__,
                      "workers": a.workers, "batch": a.batch, "images": images, "seconds": round(seconds, 4),
                      "images_per_sec": round(rate, 2), "images_per_sec_per_worker": round(rate / a.workers, 2),
                      "warmup_batches": a.warmup, "uncounted_batches": prefetched,
                      "eval": a.eval, "normalize": a.normalize}))


if __name__ == "__main__":
    main()
