#!/usr/bin/env bash
# Memory levels O0/O1/O2 (issue 8) for resnet50 224x224 fp32 on the CPU:
#   1. a fixed batch: planned arena and total (arena + parameters, gradients, momentum,
#      workspace), measured arena high-water mark and peak RSS, and step time per level;
#      one `resnet bench` process per level and round, levels interleaved, so that each RSS
#      figure is that level's alone;
#   2. the largest batch whose planned total fits a fixed cap, per level, and its step time
#      (`resnet bench --find-max-batch --memory-cap CAP`).
# Prints markdown tables (medians over ROUNDS rounds) and the issue's goals:
#   O1 at most 60% of O0's peak; O2 fits >= 1.5x O1's batch at <= 15% more time per image.
# Usage: bench/memory.sh [ROUNDS=3] [THREADS=2] [BATCH=16] [CAP=2GiB] [MODEL=resnet50]
# (CPU only: the GPU's peak device memory is in the table of scripts/gpu-check.sh.)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
threads="${2:-2}"
batch="${3:-16}"
cap="${4:-2GiB}"
model="${5:-resnet50}"
bin=./build/resnet
[ -x "$bin" ] || { echo "build first: cmake --preset default && cmake --build --preset default" >&2; exit 1; }
export OMP_NUM_THREADS="$threads"
fixed=$(mktemp)
maxb=$(mktemp)
trap 'rm -f "$fixed" "$maxb"' EXIT
common=(--model "$model" --input 3x224x224 --classes 1000 --threads "$threads" --device cpu --json)
for r in $(seq "$rounds"); do
  for level in O0 O1 O2; do
    echo "round $r/$rounds: batch $batch at $level" >&2
    "$bin" bench "${common[@]}" --batch "$batch" --memory-level "$level" --steps 3 --warmup 1 2>/dev/null >>"$fixed"
  done
  echo "round $r/$rounds: largest batch under $cap" >&2
  "$bin" bench "${common[@]}" --find-max-batch --memory-cap "$cap" --steps 2 --warmup 1 2>/dev/null >>"$maxb"
done
/usr/bin/python3 - "$fixed" "$maxb" "$threads" "$batch" "$cap" "$model" <<'PY'
import collections, datetime, json, statistics, subprocess, sys
fixed_path, maxb_path, threads, batch, cap, model = sys.argv[1:]
def rows(path):
    out = collections.defaultdict(list)
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            out[r["memory_level"]].append(r)
    return out
def med(rs, key):
    return statistics.median(r[key] for r in rs)
mib = lambda b: f"{b / 2**20:,.0f} MiB"
cpu = subprocess.run("lscpu | sed -n 's/Model name: *//p'", shell=True, capture_output=True, text=True).stdout.strip()
fixed, maxb = rows(fixed_path), rows(maxb_path)
n = len(next(iter(fixed.values())))
print(f"# memory: {datetime.date.today()} | {cpu} | {threads} threads | {model} 224px fp32 | median of {n} rounds")
print(f"\n## Batch {batch}\n")
print("| level | planned arena | planned total | measured arena high-water | measured peak RSS | step time | img/s |")
print("|---|---|---|---|---|---|---|")
for level in ("O0", "O1", "O2"):
    rs = fixed[level]
    t = med(rs, "median_step_s")
    print(f"| {level} | {mib(med(rs, 'planned_arena'))} | {mib(med(rs, 'planned_total'))} | "
          f"{mib(med(rs, 'arena_high_water'))} | {mib(med(rs, 'peak_resident'))} | {t:.3f} s | {int(batch) / t:.2f} |")
o0, o1, o2 = (fixed[l] for l in ("O0", "O1", "O2"))
print(f"\nO1 / O0: planned total {med(o1, 'planned_total') / med(o0, 'planned_total'):.0%}, "
      f"arena {med(o1, 'planned_arena') / med(o0, 'planned_arena'):.0%}, "
      f"measured peak RSS {med(o1, 'peak_resident') / med(o0, 'peak_resident'):.0%} (goal: at most 60%)")
print(f"O2 / O1: planned total {med(o2, 'planned_total') / med(o1, 'planned_total'):.0%}, "
      f"measured peak RSS {med(o2, 'peak_resident') / med(o1, 'peak_resident'):.0%}; "
      f"time per image {med(o2, 'median_step_s') / med(o1, 'median_step_s') - 1:+.1%}")
print(f"\n## Largest batch under {cap}\n")
print("| level | batch | planned total | measured arena high-water | step time | time per image | img/s |")
print("|---|---|---|---|---|---|---|")
per_image = {}
for level in ("O0", "O1", "O2"):
    rs = maxb[level]
    b = int(med(rs, "batch"))
    if b == 0:
        print(f"| {level} | does not fit | | | | | |")
        continue
    t = med(rs, "median_step_s")
    per_image[level] = t / b
    print(f"| {level} | {b} | {mib(med(rs, 'planned_total'))} | {mib(med(rs, 'arena_high_water'))} | {t:.3f} s | "
          f"{1e3 * t / b:.1f} ms | {b / t:.2f} |")
if "O1" in per_image and "O2" in per_image:
    b1, b2 = med(maxb["O1"], "batch"), med(maxb["O2"], "batch")
    print(f"\nO2 / O1: batch {b2 / b1:.2f}x (goal >= 1.5x), time per image "
          f"{per_image['O2'] / per_image['O1'] - 1:+.1%} (goal <= +15%)")
PY
