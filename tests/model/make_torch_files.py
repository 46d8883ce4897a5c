"""Writes torch.save files for tests/model/test_torch_file.cpp, and what they must read as.

Usage: /usr/bin/python3 make_torch_files.py OUT_DIR

For each case OUT_DIR/<case>.pth is written by torch.save, and OUT_DIR/<case>.expect.json lists
the state dict's tensors in order: name, safetensors dtype tag, shape and the file (under
OUT_DIR/expect/) holding the tensor's bytes, dense row-major, as PyTorch itself gives them.
"""
import argparse
import json
import os
import sys

import torch

TAGS = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def raw_bytes(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def state_dict():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 5, generator=g)
    sd = {
        "conv.weight": torch.randn(4, 3, 3, 3, generator=g),
        "half": torch.randn(7, generator=g).half(),
        "bf16": torch.randn(2, 3, generator=g).bfloat16(),
        "double": torch.randn(3, generator=g).double(),
        "counter": torch.tensor(12345678901, dtype=torch.int64),
        "ints": torch.arange(-3, 3, dtype=torch.int32),
        "bytes": torch.arange(0, 250, 50, dtype=torch.uint8),
        "mask": torch.tensor([True, False, True]),
        # views: a transpose (strides, not row-major), a slice (an offset into a shared storage)
        # and a strided slice of the same storage
        "transposed": base.t(),
        "sliced": base[2:4],
        "every_other": base[:, ::2],
        "empty": torch.zeros(0, 4),
        "param": torch.nn.Parameter(torch.randn(2, 2, generator=g)),
    }
    return sd


def expect(sd, out, case):
    os.makedirs(os.path.join(out, "expect"), exist_ok=True)
    entries = []
    for i, (name, t) in enumerate(sd.items()):
        f = f"{case}.{i}.bin"
        with open(os.path.join(out, "expect", f), "wb") as fh:
            fh.write(raw_bytes(t))
        entries.append({"name": name, "dtype": TAGS[t.dtype], "shape": list(t.shape), "file": f})
    with open(os.path.join(out, case + ".expect.json"), "w") as fh:
        json.dump(entries, fh)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    out = p.parse_args().out
    os.makedirs(out, exist_ok=True)
    sd = state_dict()

    def save(case, obj, **kw):
        torch.save(obj, os.path.join(out, case + ".pth"), **kw)

    save("zip", sd)
    expect(sd, out, "zip")
    save("legacy", sd, _use_new_zipfile_serialization=False)
    expect(sd, out, "legacy")
    save("protocol4", sd, pickle_protocol=4)
    expect(sd, out, "protocol4")
    save("legacy4", sd, _use_new_zipfile_serialization=False, pickle_protocol=4)
    expect(sd, out, "legacy4")
    # A training script's checkpoint: the weights under "state_dict" beside other things.
    ns = argparse.Namespace(arch="resnet18", lr=0.1)
    ck = {"epoch": 3, "arch": "resnet18", "best_acc1": torch.tensor(71.5), "args": ns,
          "state_dict": sd, "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}}
    save("checkpoint", ck)
    expect(sd, out, "checkpoint")
    # What must be refused: a whole module, a dict without tensors.
    save("module", torch.nn.Sequential(torch.nn.Linear(2, 3)))
    save("no_tensors", {"epoch": 3, "note": "nothing here"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
