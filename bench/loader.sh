#!/usr/bin/env bash
# Input-pipeline throughput, resnet.cpp's loader against PyTorch's DataLoader, the same
# number of worker threads/processes, training transforms (RandomResizedCrop 224 + flip,
# uint8 batches), interleaved in one invocation, on an ImageNet-like synthetic set made
# once by tools/make_image_folder.py (10 classes x 300 JPEGs around 500x375, quality 90).
#   ours, from the folder (JPEG region decode with DCT scaling)
#   ours, from packed shards (resnet pack, original JPEG bytes kept)
#   ours, from shards re-encoded with the shorter side at most 256 (resnet pack --max-size 256)
#   PyTorch: torchvision ImageFolder + PIL decode, DataLoader(num_workers=THREADS)
# Prints images/s and images/s per core for each, the median over ROUNDS rounds, and the
# ratios per core against PyTorch (goal: 2x from folders, 4x from shards).
# Usage: bench/loader.sh [ROUNDS=3] [THREADS=2] [DATA_DIR=build/bench-data/imagenet_like]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
threads="${2:-2}"
data="${3:-build/bench-data/imagenet_like}"
bin=./build/resnet
[ -x "$bin" ] || { echo "build first: cmake --preset default && cmake --build --preset default" >&2; exit 1; }
if [ ! -d "$data/train" ]; then
  echo "making the synthetic set in $data (once)" >&2
  /usr/bin/python3 tools/make_image_folder.py "$data" --classes 10 --train-per-class 300 --val-per-class 10 >&2
fi
have_pack=0
if "$bin" pack --help >/dev/null 2>&1; then
  have_pack=1
  [ -f "$data/shards/dataset.json" ] || "$bin" pack "$data/train" "$data/shards" --workers "$threads" >&2
  [ -f "$data/shards256/dataset.json" ] || "$bin" pack "$data/train" "$data/shards256" --max-size 256 \
    --workers "$threads" >&2
fi
out=$(mktemp)
ours() { # path
  "$bin" bench --data "$1" --threads "$threads" --workers "$threads" --batch 128 --warmup 2 --json 2>/dev/null |
    sed -n 's/.*"images_per_sec":\([0-9.]*\).*/\1/p'
}
torch() {
  /usr/bin/python3 bench/torch_loader.py "$data/train" --workers "$threads" --batch 128 --warmup 2 |
    sed -n 's/.*"images_per_sec": \([0-9.]*\).*/\1/p'
}
for r in $(seq "$rounds"); do
  echo "round $r/$rounds" >&2
  echo "folder ours $(ours "$data/train")" >>"$out"
  echo "folder torch $(torch)" >>"$out"
  if [ "$have_pack" = 1 ]; then
    echo "shards ours $(ours "$data/shards")" >>"$out"
    echo "shards256 ours $(ours "$data/shards256")" >>"$out"
  fi
done
/usr/bin/python3 - "$out" "$threads" <<'PY'
import statistics, sys, collections, platform, datetime
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    case, system, value = line.split()
    rows[(case, system)].append(float(value))
threads = int(sys.argv[2])
torch = statistics.median(rows[("folder", "torch")])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# {datetime.date.today()} {cpu}, {threads} worker threads/processes, medians of {len(rows[('folder', 'torch')])} rounds")
print(f"{'source':<28}{'img/s':>10}{'img/s/core':>12}{'vs PyTorch':>12}   rounds (img/s)")
def spread(key):
    return " ".join(f"{v:.0f}" for v in rows[key])
print(f"{'PyTorch folder (PIL)':<28}{torch:>10.1f}{torch / threads:>12.1f}{1.0:>11.2f}x   {spread(('folder', 'torch'))}")
for case in ("folder", "shards", "shards256"):
    if (case, "ours") in rows:
        v = statistics.median(rows[(case, "ours")])
        print(f"{'resnet.cpp ' + case:<28}{v:>10.1f}{v / threads:>12.1f}{v / torch:>11.2f}x   {spread((case, 'ours'))}")
PY
rm -f "$out"
