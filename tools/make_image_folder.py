#!/usr/bin/python3
"""Writes an ImageNet-like ImageFolder of synthetic JPEGs (Debian's python3-pil and numpy):
OUT/train/<class>/*.JPEG and OUT/val/<class>/*.JPEG, photos of about WxH pixels (sizes vary
by +-20%), smooth content with mild noise, at the given JPEG quality. Each class has its own
colour and stripe orientation, so a small network can learn them.

  make_image_folder.py OUT [--classes 10] [--train-per-class 300] [--val-per-class 50]
                           [--width 500] [--height 375] [--quality 90] [--seed 0]
"""
import argparse
import math
import os

import numpy as np
from PIL import Image


def image(rng, cls, classes, w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = math.pi * cls / classes
    freq = 2 * math.pi / (20 + 60 * rng.random())
    phase = rng.random() * 6.28
    stripes = np.sin((x * math.cos(angle) + y * math.sin(angle)) * freq + phase)
    base = np.array([(37 * cls) % 200 + 30, (91 * cls) % 200 + 30, (151 * cls) % 200 + 30], np.float32)
    blob = np.exp(-(((x - w * rng.random()) ** 2) + ((y - h * rng.random()) ** 2)) / (2 * (0.2 * w) ** 2))
    img = base + 50 * stripes[..., None] + 60 * blob[..., None] + rng.normal(0, 4, (h, w, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=300)
    p.add_argument("--val-per-class", type=int, default=50)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    for split, per_class in (("train", a.train_per_class), ("val", a.val_per_class)):
        for c in range(a.classes):
            d = os.path.join(a.out, split, "n%08d" % c)
            os.makedirs(d, exist_ok=True)
            for i in range(per_class):
                w = int(a.width * (0.8 + 0.4 * rng.random()))
                h = int(a.height * (0.8 + 0.4 * rng.random()))
                image(rng, c, a.classes, w, h).save(os.path.join(d, "n%08d_%d.JPEG" % (c, i)), quality=a.quality)
    print("wrote %d train and %d val images to %s" % (a.classes * a.train_per_class, a.classes * a.val_per_class,
                                                       a.out))


if __name__ == "__main__":
    main()
