#!/usr/bin/env bash
# Training-step throughput, resnet.cpp against PyTorch (torchvision model, channels_last,
# the same thread count, synthetic data), interleaved in one invocation:
#   resnet50 224x224 batch 16, fp32 and bf16 (PyTorch: autocast bf16; ours: O1, the same
#   split, and O2, a bf16 model), and resnet20 28x28 batch 128 fp32; the fp32 cases in both
#   implementation modes (high_performance, the default: Winograd 3x3 convolutions where
#   they pay; high_precision: direct convolutions only).
# Prints images/s per system and the ratio (ours / PyTorch); each figure is the median
# step time over --steps timed steps, and the table takes the median over ROUNDS rounds.
# PyTorch runs twice when jemalloc is installed (`apt-get install libjemalloc2`): as it comes,
# and with jemalloc set to keep freed memory (dirty_decay_ms:-1). PyTorch's default CPU
# allocator hands large blocks back to the system and faults them in again every step, which
# cost it 30-40% on ResNet-50 on dev-2c, nothing on dev-2c-xeon (bench/RESULTS.md); the second column is PyTorch without
# that cost, the fairer measure of the kernels.
# Usage: bench/cpu_step.sh [ROUNDS=3] [THREADS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
threads="${2:-2}"
bin=./build/resnet
[ -x "$bin" ] || { echo "build first: cmake --preset default && cmake --build --preset default" >&2; exit 1; }
export OMP_NUM_THREADS="$threads"
out=$(mktemp)
ours() { # model input classes batch precision steps [bench options]
  "$bin" bench --model "$1" --input "$2" --classes "$3" --batch "$4" --precision "$5" --steps "$6" --warmup 2 \
    --threads "$threads" --device cpu --json "${@:7}" 2>/dev/null | sed -n 's/.*"images_per_sec":\([0-9.]*\).*/\1/p'
}
jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
[ -f "$jemalloc" ] || echo "no $jemalloc: PyTorch runs with its default allocator only" >&2
torch() { # model channels size classes batch dtype steps
  /usr/bin/python3 bench/torch_step.py --model "$1" --channels "$2" --size "$3" --classes "$4" --batch "$5" \
    --dtype "$6" --steps "$7" --warmup 2 --threads "$threads" | sed -n 's/.*img\/s=\([0-9.]*\).*/\1/p'
}
torch_je() { # the same, with jemalloc keeping freed memory (prints nothing without jemalloc)
  [ -f "$jemalloc" ] || return 0
  MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 LD_PRELOAD="$jemalloc" torch "$@"
}
for r in $(seq "$rounds"); do
  echo "round $r/$rounds" >&2
  echo "resnet50_fp32 ours $(ours resnet50 3x224x224 1000 16 O0 5)" >>"$out"
  echo "resnet50_fp32 torch $(torch resnet50 3 224 1000 16 fp32 5)" >>"$out"
  echo "resnet50_fp32 torch_je $(torch_je resnet50 3 224 1000 16 fp32 5)" >>"$out"
  echo "resnet50_fp32_hp ours $(ours resnet50 3x224x224 1000 16 O0 5 --high-precision)" >>"$out"
  echo "resnet50_bf16_O1 ours $(ours resnet50 3x224x224 1000 16 O1 5)" >>"$out"
  echo "resnet50_bf16_O2 ours $(ours resnet50 3x224x224 1000 16 O2 5)" >>"$out"
  echo "resnet50_bf16 torch $(torch resnet50 3 224 1000 16 bf16 5)" >>"$out"
  echo "resnet50_bf16 torch_je $(torch_je resnet50 3 224 1000 16 bf16 5)" >>"$out"
  echo "resnet20_fp32 ours $(ours resnet20 1x28x28 10 128 O0 20)" >>"$out"
  echo "resnet20_fp32 torch $(torch resnet20 1 28 10 128 fp32 20)" >>"$out"
  echo "resnet20_fp32 torch_je $(torch_je resnet20 1 28 10 128 fp32 20)" >>"$out"
  echo "resnet20_fp32_hp ours $(ours resnet20 1x28x28 10 128 O0 20 --high-precision)" >>"$out"
done
/usr/bin/python3 - "$out" "$threads" <<'PY'
import statistics, sys, collections, platform, subprocess, datetime
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 3:  # a missing figure (no jemalloc) leaves two fields
        rows[(parts[0], parts[1])].append(float(parts[2]))
med = {k: statistics.median(v) for k, v in rows.items()}
cpu = subprocess.run("lscpu | sed -n 's/Model name: *//p'", shell=True, capture_output=True, text=True).stdout.strip()
print(f"# cpu_step: {datetime.date.today()} | {cpu} | {sys.argv[2]} threads | median of {len(next(iter(rows.values())))} rounds")
print("| case | resnet.cpp img/s | PyTorch img/s | ratio | PyTorch + jemalloc img/s | ratio |")
print("|---|---|---|---|---|---|")
pairs = [("resnet50 224px b16 fp32", "resnet50_fp32", "resnet50_fp32"),
         ("resnet50 224px b16 fp32, high_precision (direct convolutions)", "resnet50_fp32_hp", "resnet50_fp32"),
         ("resnet50 224px b16 bf16 (ours O1 vs autocast)", "resnet50_bf16_O1", "resnet50_bf16"),
         ("resnet50 224px b16 bf16 (ours O2 vs autocast)", "resnet50_bf16_O2", "resnet50_bf16"),
         ("resnet20 28px b128 fp32", "resnet20_fp32", "resnet20_fp32"),
         ("resnet20 28px b128 fp32, high_precision (direct convolutions)", "resnet20_fp32_hp", "resnet20_fp32")]
for name, o, t in pairs:
    a, b = med[(o, "ours")], med[(t, "torch")]
    je = med.get((t, "torch_je"))
    je_cols = f"{je:.2f} | {a / je:.2f}x" if je else "- | -"
    print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {je_cols} |")
PY
rm -f "$out"
