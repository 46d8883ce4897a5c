#!/usr/bin/python3
"""Convert torchvision ResNet weights to safetensors and back.

  torchvision_to_safetensors.py --model resnet50 --weights resnet50.pth --out resnet50.safetensors
  torchvision_to_safetensors.py --model resnet18 --random --seed 0 --out resnet18.safetensors
  torchvision_to_safetensors.py --model resnet50 --reverse resnet50.safetensors --out state_dict.pth

Tensor names are torchvision's state-dict names, unchanged (see docs/weights.md). Floating
tensors are written as F32. BN's num_batches_tracked counters (int64) are dropped unless
--keep-num-batches-tracked is given. The classifier's size comes from the file's fc.weight
(a model fine-tuned to 5 classes converts as it is), or --num-classes for --random. --reverse loads a safetensors file into the torchvision
model strictly (every name present, no extra names, same shapes; only num_batches_tracked may
be absent, and then keeps the model's zero) and saves model.state_dict() with torch.save.

The `safetensors` Python package is not needed: the format is written with json and struct.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch
import torchvision

MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
MAX_HEADER_BYTES = 100 << 20

# safetensors tag -> numpy dtype (little-endian). BF16 has no numpy type and is handled apart.
NUMPY_OF_TAG = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U8": "u1", "BOOL": "?",
}
TAG_OF_TORCH = {
    torch.float32: "F32", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL",
}
ELEMENT_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1}


def fail(message):
    sys.exit(f"torchvision_to_safetensors: error: {message}")


def build_model(name, num_classes=1000):
    if name not in MODELS:
        fail(f"unknown model '{name}' (expected one of {', '.join(MODELS)})")
    return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)


def classes_of(tensors, default):
    """The classifier's output count, from fc.weight [classes, features] when present."""
    fc = tensors.get("fc.weight")
    return int(fc.shape[0]) if fc is not None and len(fc.shape) == 2 else default


def is_num_batches_tracked(name):
    return name.endswith("num_batches_tracked")


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, torch.Tensor) on the CPU. Written atomically (temporary + rename)."""
    # Larger elements first, stable otherwise: every offset stays a multiple of its element size.
    arrays = []
    for name, t in tensors:
        t = t.detach().cpu().contiguous()
        if t.is_floating_point():
            t = t.to(torch.float32)
        if t.dtype not in TAG_OF_TORCH:
            fail(f"tensor '{name}' has unsupported dtype {t.dtype}")
        tag = TAG_OF_TORCH[t.dtype]
        arrays.append((name, tag, list(t.shape), t.numpy().astype(NUMPY_OF_TAG[tag], copy=False)))
    arrays.sort(key=lambda a: -ELEMENT_SIZE[a[1]])

    header = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, tag, shape, array in arrays:
        header[name] = {"dtype": tag, "shape": shape, "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)

    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, _, _, array in arrays:
                f.write(array.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_safetensors(path):
    """Returns ({name: torch.Tensor}, metadata), validating offsets and sizes."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail(f"{path}: file too short ({len(blob)} bytes)")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > MAX_HEADER_BYTES or header_len > len(blob) - 8:
        fail(f"{path}: header length {header_len} is absurd or exceeds the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"{path}: header is not valid JSON: {e}")
    if not isinstance(header, dict):
        fail(f"{path}: header is not a JSON object")
    data = blob[8 + header_len:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        where = f"{path}: tensor '{name}'"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            fail(f"{where}: entry must be an object with dtype, shape, data_offsets")
        tag, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        if tag not in ELEMENT_SIZE:
            fail(f"{where}: unsupported dtype '{tag}'")
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= begin <= end <= len(data) or end - begin != numel * ELEMENT_SIZE[tag]:
            fail(f"{where}: data_offsets [{begin}, {end}] do not fit {tag}{shape} in {len(data)} data bytes")
        raw = data[begin:end]
        if tag == "BF16":  # bf16 is the top half of an f32
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=NUMPY_OF_TAG[tag])
        tensors[name] = torch.from_numpy(array.copy()).reshape(shape)
    return tensors, metadata


def load_state_dict(path):
    sd = torch.load(path, map_location="cpu")
    for key in ("state_dict", "model"):  # training checkpoints wrap the state dict
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
    if sd and all(k.startswith("module.") for k in sd):  # saved from DistributedDataParallel
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def to_safetensors(args):
    torch.manual_seed(args.seed)  # --random: torchvision's own initialisation from a seeded generator
    if not args.weights:
        model = build_model(args.model, args.num_classes)
    source = f"random seed {args.seed}"
    if args.weights:
        # Strict loading checks that the weights belong to this architecture (with the
        # classifier the file has: a fine-tuned model has its own number of classes).
        sd = load_state_dict(args.weights)
        model = build_model(args.model, classes_of(sd, args.num_classes))
        model.load_state_dict(sd, strict=True)
        source = os.path.basename(args.weights)
    tensors = [(name, t) for name, t in model.state_dict().items()
               if args.keep_num_batches_tracked or not is_num_batches_tracked(name)]
    metadata = {"format": "pt", "model": args.model, "source": source,
                "converter": "tools/torchvision_to_safetensors.py"}
    write_safetensors(args.out, tensors, metadata)
    print(f"wrote {len(tensors)} tensors to {args.out}")


def from_safetensors(args):
    tensors, metadata = read_safetensors(args.reverse)
    held = (metadata or {}).get("model", "")
    if held and held not in MODELS:
        fail(f"{args.reverse} holds {held}, which torchvision does not have (it has {', '.join(MODELS)}; "
             "the CIFAR ResNets resnet20..110 are resnet.cpp's own): such weights stay safetensors")
    model = build_model(args.model, classes_of(tensors, args.num_classes))
    expected = model.state_dict()
    extra = sorted(set(tensors) - set(expected))
    missing = sorted(n for n in set(expected) - set(tensors) if not is_num_batches_tracked(n))
    if extra or missing:
        fail(f"{args.reverse} does not match torchvision {args.model}: "
             f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
             f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}")
    state = dict(expected)
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            fail(f"{args.reverse}: tensor '{name}' has shape {list(t.shape)}, "
                 f"torchvision {args.model} expects {list(expected[name].shape)}")
        state[name] = t.to(expected[name].dtype)
    model.load_state_dict(state, strict=True)
    torch.save(model.state_dict(), args.out)
    print(f"loaded {len(tensors)} tensors into torchvision {args.model}, saved its state dict to {args.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help=f"one of {', '.join(MODELS)}")
    p.add_argument("--out", required=True, help="output .safetensors (or .pth with --reverse)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--weights", help="torchvision state dict (.pth) to convert")
    source.add_argument("--random", action="store_true", help="torchvision's random initialisation")
    source.add_argument("--reverse", metavar="IN.safetensors", help="convert a safetensors file back to a .pth")
    p.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    p.add_argument("--num-classes", type=int, default=1000,
                   help="classifier outputs for --random (default 1000); --weights and --reverse take "
                        "them from the file's fc.weight")
    p.add_argument("--keep-num-batches-tracked", action="store_true",
                   help="also write BN num_batches_tracked (I64) counters")
    args = p.parse_args()
    if args.reverse:
        from_safetensors(args)
    elif args.weights or args.random:
        to_safetensors(args)
    else:
        p.error("one of --weights, --random or --reverse is required")


if __name__ == "__main__":
    main()
