#!/usr/bin/env bash
# The default recipe (configs/fashion_mnist_resnet20.yaml: resnet20, batch 128, 5 epochs) in
# resnet.cpp and the same recipe in PyTorch (bench/torch_fashion_mnist.py), one after the
# other on this machine with the same thread count. Prints wall time per epoch, final test
# accuracy and the time ratio. Usage: bench/fashion_mnist.sh [THREADS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-2}"
run_dir=$(mktemp -d)/run
./build/resnet train --config configs/fashion_mnist_resnet20.yaml --set run.out_dir="$run_dir" \
  --set run.threads="$threads" 2>"$run_dir.log" | tee "$run_dir.out"
ours_epoch=$(/usr/bin/python3 - "$run_dir/metrics.jsonl" <<'PY'
import json, sys, statistics
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ev = [r for r in recs if r["kind"] == "eval"]
times = [r["time"] for r in ev]
# time per epoch from eval timestamps (evaluation time included, as in the PyTorch script's wall clock minus eval)
per = [b - a for a, b in zip([0] + times[:-1], times)]
print(f"{statistics.median(per):.2f} {ev[-1]['top1']:.4f}")
PY
)
torch_line=$(/usr/bin/python3 bench/torch_fashion_mnist.py --threads "$threads" --epochs 5 | tee /dev/stderr | tail -1)
torch_epoch=$(echo "$torch_line" | sed -n 's/.*seconds_per_epoch=\([0-9.]*\).*/\1/p')
torch_top1=$(echo "$torch_line" | sed -n 's/.*top1=\([0-9.]*\).*/\1/p')
read -r ours_e ours_top1 <<<"$ours_epoch"
echo "| system | s/epoch | test top-1 |"
echo "|---|---|---|"
echo "| resnet.cpp | $ours_e | $ours_top1 |"
echo "| PyTorch | $torch_epoch | $torch_top1 |"
/usr/bin/python3 -c "print(f'speed ratio (PyTorch time / ours): {float(\"$torch_epoch\") / float(\"$ours_e\"):.2f}x')"
