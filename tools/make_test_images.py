#!/usr/bin/python3
"""Writes the image files the decoder and resize tests check against, with PIL (Debian's
python3-pil) as the reference: what torchvision's ImageFolder + PIL pipeline would see.

  make_test_images.py OUT_DIR

OUT_DIR/manifest.json lists every case. Decode cases: an encoded file and the RGB pixels PIL
decodes from it (Image.open(f).convert("RGB")), stored raw in <name>.rgb. Resize cases: the
pixels PIL produces for a crop-then-bilinear-resize (RandomResizedCrop's geometry) and for
Resize(short side) + CenterCrop (the evaluation transform), from the baseline image.
Nothing is downloaded; the content is smooth gradients plus mild noise, like photographs.
"""
import json
import os
import sys

import numpy as np
from PIL import Image


def smooth_rgb(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 128 + 100 * np.sin(x / (w / 3.1) + seed)
    g = 128 + 100 * np.cos(y / (h / 2.3) - seed)
    b = 128 + 90 * np.sin((x + y) / (w / 4.7))
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 6, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cases = []

    def decode_case(name, path, kind):
        ref = Image.open(path).convert("RGB")
        arr = np.asarray(ref, dtype=np.uint8)
        arr.tofile(os.path.join(out, name + ".rgb"))
        cases.append({"name": name, "file": os.path.basename(path), "kind": kind,
                      "width": ref.width, "height": ref.height})

    rgb = Image.fromarray(smooth_rgb(203, 141, 1))  # odd sizes: partial MCUs at both edges
    p = os.path.join(out, "baseline.jpg")
    rgb.save(p, quality=90)
    decode_case("baseline", p, "jpeg")

    p = os.path.join(out, "progressive.jpg")
    rgb.save(p, quality=85, progressive=True)
    decode_case("progressive", p, "jpeg")

    p = os.path.join(out, "baseline444.jpg")
    rgb.save(p, quality=95, subsampling=0)
    decode_case("baseline444", p, "jpeg")

    p = os.path.join(out, "gray.jpg")
    rgb.convert("L").save(p, quality=90)
    decode_case("gray", p, "jpeg")

    p = os.path.join(out, "cmyk.jpg")
    rgb.convert("CMYK").save(p, quality=90)
    decode_case("cmyk", p, "jpeg")

    # The same without Adobe's APP14 marker (as some writers leave it out): PIL still takes the
    # storage as Adobe-inverted, so must we.
    data = open(p, "rb").read()
    at = data.find(b"\xff\xee")
    assert at > 0, "PIL wrote no APP14 marker"
    length = int.from_bytes(data[at + 2:at + 4], "big")
    p = os.path.join(out, "cmyk_no_adobe.jpg")
    with open(p, "wb") as f:
        f.write(data[:at] + data[at + 2 + length:])
    decode_case("cmyk_no_adobe", p, "jpeg")

    # ImageNet has PNGs named .JPEG: the decoder must go by content.
    p = os.path.join(out, "png_as_jpeg.JPEG")
    rgb.save(p, format="PNG")
    decode_case("png_as_jpeg", p, "png")

    p = os.path.join(out, "rgba.png")
    rgba = rgb.copy()
    rgba.putalpha(Image.fromarray(smooth_rgb(203, 141, 7)[:, :, 0]))
    rgba.save(p)
    decode_case("rgba", p, "png")

    p = os.path.join(out, "palette.png")
    rgb.convert("P", palette=Image.ADAPTIVE, colors=64).save(p)
    decode_case("palette", p, "png")

    p = os.path.join(out, "gray.png")
    rgb.convert("L").save(p)
    decode_case("gray_png", p, "png")

    # Resize references from the decoded baseline image (the same pixels our decoder gives).
    base = Image.open(os.path.join(out, "baseline.jpg")).convert("RGB")
    resizes = []
    crops = [(0, 0, 203, 141, 64, 64), (17, 9, 150, 120, 224, 224), (50, 31, 40, 30, 96, 80),
             (3, 5, 199, 131, 37, 53), (100, 70, 103, 71, 103, 71)]
    for i, (x, y, w, h, ow, oh) in enumerate(crops):
        res = base.crop((x, y, x + w, y + h)).resize((ow, oh), Image.BILINEAR)
        name = "crop%d" % i
        np.asarray(res, dtype=np.uint8).tofile(os.path.join(out, name + ".rgb"))
        resizes.append({"name": name, "x": x, "y": y, "w": w, "h": h, "out_w": ow, "out_h": oh})
    # Evaluation: torchvision.transforms.Resize(short) then CenterCrop(crop), on PIL.
    evals = []
    for short, crop in [(128, 112), (100, 100), (160, 97)]:
        w, h = base.size
        if w <= h:
            nw, nh = short, int(short * h / w)
        else:
            nw, nh = int(short * w / h), short
        res = base.resize((nw, nh), Image.BILINEAR)
        top = int(round((nh - crop) / 2.0))
        left = int(round((nw - crop) / 2.0))
        res = res.crop((left, top, left + crop, top + crop))
        name = "eval_%d_%d" % (short, crop)
        np.asarray(res, dtype=np.uint8).tofile(os.path.join(out, name + ".rgb"))
        evals.append({"name": name, "short": short, "crop": crop, "resized_w": nw, "resized_h": nh,
                      "left": left, "top": top})

    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"decode": cases, "resize": resizes, "eval": evals}, f, indent=1)


if __name__ == "__main__":
    main()
