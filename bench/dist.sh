#!/usr/bin/env bash
# Gradient fusion sweep (issue 6): a 2-rank data-parallel CPU run under mpirun for each
# fusion threshold, plus a 1-rank run of the same per-rank batch as the baseline. Reports,
# per threshold: buckets, step time, all-reduce time per step, the share of it hidden
# behind backward, and the scaling efficiency (2-rank images/s over twice the 1-rank
# images/s). Medians over ROUNDS rounds, thresholds interleaved within each round.
# Usage: bench/dist.sh [ROUNDS=3] [MODEL=resnet50] [SIZE=64] [BATCH=8] [STEPS=12]
# (On a GPU machine with several GPUs the same sweep runs the CUDA backend with NCCL once it
# lands; the scaling goal there is > 95% on 8 GPUs.)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
model="${2:-resnet50}"
size="${3:-64}"
batch="${4:-8}"
steps="${5:-12}"
bin=$PWD/build/resnet
[ -x "$bin" ] || { echo "build first: cmake --preset default && cmake --build --preset default" >&2; exit 1; }
thresholds=(65536 262144 1048576 4194304 16777216 67108864)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
common=(train --set data.dataset=synthetic --set model.name="$model" --set model.in_channels=3
        --set "model.image_size=$size" --set model.num_classes=1000 --set data.train_subset=100000
        --set "data.mean=[0.5, 0.5, 0.5]" --set "data.std=[0.25, 0.25, 0.25]"
        --set data.workers=1 --set run.threads=1 --set run.log_interval_steps=2 --set schedule.epochs=1
        --set schedule.warmup_epochs=0 --set "data.batch_size=$batch" --max-steps "$steps")
for r in $(seq "$rounds"); do
  echo "round $r/$rounds: 1 rank" >&2
  "$bin" "${common[@]}" --set "run.out_dir=$work/r$r-single" >"$work/r$r-single.out" 2>&1 || { cat "$work/r$r-single.out" >&2; exit 1; }
  for t in "${thresholds[@]}"; do
    echo "round $r/$rounds: 2 ranks, fusion threshold $t" >&2
    mpirun -np 2 --bind-to core "${root[@]}" "$bin" "${common[@]}" --set "dist.fusion_threshold=$t" \
      --set "run.out_dir=$work/r$r-t$t" >"$work/r$r-t$t.out" 2>&1 || { cat "$work/r$r-t$t.out" >&2; exit 1; }
  done
done
/usr/bin/python3 - "$work" "$rounds" "$model" "$size" "$batch" "$steps" "${thresholds[@]}" <<'PY'
import datetime, json, os, re, statistics, subprocess, sys
work, rounds, model, size, batch, steps = sys.argv[1:7]
thresholds = [int(t) for t in sys.argv[7:]]
rounds = int(rounds)
def intervals(run):
    recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"kind":"train"' in l]
    return recs[1:]  # the first interval includes warm-up
def buckets(run):
    m = re.search(r"gradient fusion: (\d+) buckets", open(os.path.join(run, "train.log")).read())
    return int(m.group(1)) if m else 0
single = statistics.median(statistics.median(r["images_per_sec"] for r in intervals(f"{work}/r{k}-single"))
                           for k in range(1, rounds + 1))
print(f"## Gradient fusion sweep: 2 ranks x 1 core, {model} {size}x{size}, batch {batch} per rank, fp32")
print()
print(f"`bash bench/dist.sh {rounds} {model} {size} {batch} {steps}`, {datetime.date.today()}, "
      f"{os.cpu_count()}-core machine; medians of {rounds} rounds (steps after the first logging interval).")
print(f"1 rank: {single:.1f} img/s.")
print()
print("| fusion threshold | buckets | step ms | all-reduce ms/step | hidden behind backward | exposed ms/step | img/s (2 ranks) | scaling efficiency |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for t in thresholds:
    ips, comm, hidden, exposed = [], [], [], []
    for k in range(1, rounds + 1):
        iv = intervals(f"{work}/r{k}-t{t}")
        ips.append(statistics.median(r["images_per_sec"] for r in iv))
        comm.append(statistics.median(r["comm_ms"] for r in iv))
        hidden.append(statistics.median(r["comm_hidden_share"] for r in iv))
        exposed.append(statistics.median(r["comm_exposed_ms"] for r in iv))
    m = statistics.median
    step_ms = 1000 * 2 * int(batch) / m(ips)
    label = f"{t // 1024} KiB" if t < 1 << 20 else f"{t >> 20} MiB"
    print(f"| {label} | {buckets(f'{work}/r1-t{t}')} | {step_ms:.0f} | {m(comm):.1f} | {100 * m(hidden):.0f}% | "
          f"{m(exposed):.1f} | {m(ips):.1f} | {100 * m(ips) / (2 * single):.0f}% |")
PY
