#!/usr/bin/env python3
"""Checks an ONNX file written by `resnet export --out X.onnx` against logits resnet.cpp
computed for the same input: ONNX's own checker, then every node evaluated by the ONNX
operator's definition with PyTorch's functional ops (an evaluator independent of
resnet.cpp's kernels), and the norm-wise relative error of the logits.

Run with Debian's python3-onnx and python3-torch (/usr/bin/python3):
  tools/onnx_check.py model.onnx --input input.f32 --logits logits.f32 [--tolerance 1e-4]
input.f32: the normalised batch, raw little-endian fp32, NCHW; logits.f32: [N, classes].
Exit 0: within the tolerance; 1: outside it; 2: a malformed model or an operator this
evaluator does not know.
"""
import argparse
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn.functional as F


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def symmetric_pads(pads, what):
    half = len(pads) // 2
    if list(pads[:half]) != list(pads[half:]):
        raise ValueError(f"{what}: asymmetric pads {list(pads)}")
    return tuple(pads[:half])


def run_node(node, v):
    a = attrs(node)
    x = [v[i] for i in node.input]
    op = node.op_type
    if op == "Conv":
        k = tuple(a["kernel_shape"])
        if tuple(x[1].shape[2:]) != k:
            raise ValueError(f"{node.name}: kernel_shape {k} against weight {tuple(x[1].shape)}")
        return F.conv2d(x[0], x[1], x[2] if len(x) > 2 else None, stride=tuple(a.get("strides", [1, 1])),
                        padding=symmetric_pads(a.get("pads", [0, 0, 0, 0]), node.name),
                        dilation=tuple(a.get("dilations", [1, 1])), groups=a.get("group", 1))
    if op == "BatchNormalization":
        return F.batch_norm(x[0], x[3], x[4], x[1], x[2], training=False, eps=a.get("epsilon", 1e-5))
    if op == "Relu":
        return torch.relu(x[0])
    if op == "Add":
        return x[0] + x[1]
    if op == "MaxPool":
        return F.max_pool2d(x[0], tuple(a["kernel_shape"]), stride=tuple(a.get("strides", [1, 1])),
                            padding=symmetric_pads(a.get("pads", [0, 0, 0, 0]), node.name))
    if op == "GlobalAveragePool":
        return x[0].mean(dim=(2, 3), keepdim=True)
    if op == "Flatten":
        axis = a.get("axis", 1)
        return x[0].reshape(int(np.prod(x[0].shape[:axis])), -1)
    if op == "Gemm":
        w = x[1].t() if a.get("transB", 0) else x[1]
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            raise ValueError(f"{node.name}: Gemm attributes {a} not handled")
        y = x[0] @ w
        return y + x[2] if len(x) > 2 else y
    raise ValueError(f"{node.name}: operator {op} is not known to this checker")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--input", required=True)
    p.add_argument("--logits", required=True)
    p.add_argument("--tolerance", type=float, default=1e-4)
    args = p.parse_args()

    try:
        model = onnx.load(args.model)
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001: any failure to load is the model's
        print(f"{args.model}: not a valid ONNX model: {e}", file=sys.stderr)
        return 2
    g = model.graph
    if len(g.input) != 1 or len(g.output) != 1:
        print(f"{args.model}: expected one input and one output, got {len(g.input)} and {len(g.output)}",
              file=sys.stderr)
        return 2
    dims = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim][1:]
    x = np.fromfile(args.input, dtype="<f4")
    per_sample = int(np.prod(dims))
    if x.size == 0 or x.size % per_sample:
        print(f"{args.input}: {x.size} values is not a whole number of {dims} samples", file=sys.stderr)
        return 2
    values = {g.input[0].name: torch.from_numpy(x.reshape([-1] + dims).copy())}
    for init in g.initializer:
        values[init.name] = torch.from_numpy(onnx.numpy_helper.to_array(init).copy())
    ops = {}
    with torch.no_grad():
        try:
            for node in g.node:
                values[node.output[0]] = run_node(node, values)
                ops[node.op_type] = ops.get(node.op_type, 0) + 1
        except (ValueError, KeyError) as e:
            print(f"{args.model}: {e}", file=sys.stderr)
            return 2
    got = values[g.output[0].name].double().numpy()
    want = np.fromfile(args.logits, dtype="<f4").astype(np.float64)
    if got.size != want.size:
        print(f"logits: the model gives {got.shape}, {args.logits} holds {want.size} values", file=sys.stderr)
        return 1
    err = np.linalg.norm(got.ravel() - want) / max(np.linalg.norm(want), 1e-30)
    summary = ", ".join(f"{k} {n}" for k, n in sorted(ops.items()))
    print(f"{args.model}: {len(g.node)} nodes ({summary}); logits {list(got.shape)}, relative error {err:.3e} "
          f"(tolerance {args.tolerance:g})")
    return 0 if err <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
