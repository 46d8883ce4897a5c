#!/usr/bin/env python3
"""Compares the latest checkpoints (step-*.safetensors) of two run folders tensor by tensor,
byte for byte, ignoring the metadata (which holds the run's own config). Used by
scripts/gpu-check.sh to show that eager and sink (CUDA graph) training end identical.
Exit 0 when every tensor is identical; prints the largest differences otherwise.
Needs only the Python standard library (the safetensors layout: u64 header length, JSON
header, data)."""
import glob
import json
import os
import struct
import sys
import array


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def latest(folder):
    files = sorted(glob.glob(os.path.join(folder, "step-*.safetensors")))
    if not files:
        sys.exit(f"compare_checkpoints: no step-*.safetensors in {folder}")
    return files[-1]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: compare_checkpoints.py RUN_A/checkpoints RUN_B/checkpoints")
    pa, pb = latest(sys.argv[1]), latest(sys.argv[2])
    a, b = load(pa), load(pb)
    print(f"comparing {pa} and {pb}: {len(a)} and {len(b)} tensors")
    if os.path.basename(pa) != os.path.basename(pb):
        print(f"different final steps: {os.path.basename(pa)} vs {os.path.basename(pb)}")
        return 1
    if a.keys() != b.keys():
        print("different tensor names:", sorted(set(a) ^ set(b))[:10])
        return 1
    bad = []
    for k in sorted(a):
        if a[k][:2] != b[k][:2]:
            bad.append((float("inf"), k))
        elif a[k][2] != b[k][2]:
            diff = 0.0
            if a[k][0] == "F32":
                x, y = array.array("f", a[k][2]), array.array("f", b[k][2])
                diff = max(abs(p - q) for p, q in zip(x, y))
            bad.append((diff, k))
    if bad:
        bad.sort(reverse=True)
        print(f"{len(bad)} of {len(a)} tensors differ; largest absolute differences:")
        for d, k in bad[:10]:
            print(f"  {k}: {d:.3g}")
        return 1
    print(f"all {len(a)} tensors identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
