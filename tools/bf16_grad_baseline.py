#!/usr/bin/python3
"""How far bf16 moves the first gradient of a CIFAR-style ResNet in PyTorch, for comparison with
`resnet doctor` (docs/troubleshooting.md): from the same initial weights and one batch,

  autocast  the gradient under torch.autocast("cpu", bfloat16), against fp32;
  rounding  the fp32 gradient from weights and input rounded to bf16, against fp32 (the
            doctor's "rounding baseline": the network's own sensitivity);

as relative L2 differences over the whole gradient, and the largest over single tensors.

  /usr/bin/python3 tools/bf16_grad_baseline.py [--blocks 9] [--seeds 3] [--batch 128]

--blocks 3 is resnet20, 9 resnet56 (basic blocks per stage, 16/32/64 channels, one input
channel, 28x28 standard-normal input, kaiming-normal convolutions as torchvision).
"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


def cifar_resnet(blocks, classes=10):
    layers = [nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for b in range(blocks):
            layers.append(BasicBlock(cin, cout, stride if b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes)]
    net = nn.Sequential(*layers)
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return net


def differences(reference, other):
    """(whole-gradient relative difference, largest single-tensor relative difference)."""
    d2 = n2 = 0.0
    worst = 0.0
    for p, q in zip(reference.parameters(), other.parameters()):
        d = (p.grad - q.grad.float()).norm().item()
        n = p.grad.norm().item()
        d2 += d * d
        n2 += n * n
        if n > 0:
            worst = max(worst, d / n)
    return (d2 / n2) ** 0.5, worst


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=9, help="basic blocks per stage (3: resnet20, 9: resnet56)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    name = f"resnet{6 * args.blocks + 2}"
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        fp32 = cifar_resnet(args.blocks).train()
        x = torch.randn(args.batch, 1, 28, 28)
        y = torch.randint(0, 10, (args.batch,))
        auto, rounded = copy.deepcopy(fp32), copy.deepcopy(fp32)
        with torch.no_grad():
            for w in rounded.parameters():
                w.copy_(w.bfloat16().float())
        F.cross_entropy(fp32(x), y).backward()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(auto(x), y)
        loss.backward()
        F.cross_entropy(rounded(x.bfloat16().float()), y).backward()
        a_whole, a_worst = differences(fp32, auto)
        r_whole, r_worst = differences(fp32, rounded)
        print(f"{name} seed {seed}: autocast whole {100 * a_whole:.2f}% (worst tensor {100 * a_worst:.2f}%), "
              f"rounding whole {100 * r_whole:.2f}% (worst tensor {100 * r_worst:.2f}%), "
              f"ratio {a_whole / r_whole:.2f}x")


if __name__ == "__main__":
    main()
