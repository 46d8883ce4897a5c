#!/usr/bin/env bash
# What synchronised batch norm costs in a data-parallel CPU run: 2 MPI ranks x 1 core,
# resnet50 at 64x64 on synthetic data, batch 8 per rank, fp32, dist.sync_bn false and true,
# interleaved, ROUNDS rounds; prints each configuration's images/s per round (median of the
# logging intervals after the first) and the median over the rounds.
# Usage: bench/sync_bn.sh [ROUNDS=3] [STEPS=12]
# RN_BASELINE="cmd ..." also runs another build the same way (for example an older binary
# started through its own loader), labelled "baseline".
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
steps="${2:-12}"
[ -x build/resnet ] || { echo "build first: cmake --preset default && cmake --build --preset default" >&2; exit 1; }
declare -A bins=([current]="$PWD/build/resnet")
[ -n "${RN_BASELINE:-}" ] && bins[baseline]="$RN_BASELINE"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
common=(train --set data.dataset=synthetic --set model.name=resnet50 --set model.in_channels=3
        --set model.image_size=64 --set model.num_classes=1000 --set data.train_subset=100000
        --set "data.mean=[0.5, 0.5, 0.5]" --set "data.std=[0.25, 0.25, 0.25]"
        --set data.workers=1 --set run.threads=1 --set run.log_interval_steps=2 --set schedule.epochs=1
        --set schedule.warmup_epochs=0 --set data.batch_size=8 --max-steps "$steps")
for r in $(seq "$rounds"); do
  for which in "${!bins[@]}"; do
    read -r -a bin <<< "${bins[$which]}"
    for sync in false true; do
      echo "round $r/$rounds: $which, dist.sync_bn=$sync" >&2
      out="$work/r$r-$which-$sync"
      mpirun -np 2 --bind-to core "${root[@]}" "${bin[@]}" "${common[@]}" --set "dist.sync_bn=$sync" \
        --set "run.out_dir=$out" >"$out.out" 2>&1 || { tail -20 "$out.out" >&2; exit 1; }
    done
  done
done
/usr/bin/python3 - "$work" "$rounds" "${!bins[@]}" <<'PY'
import json, statistics, sys
work, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for which in names:
    for sync in ("false", "true"):
        per_round = []
        for r in range(1, rounds + 1):
            recs = [json.loads(l) for l in open(f"{work}/r{r}-{which}-{sync}/metrics.jsonl") if '"kind":"train"' in l]
            per_round.append(statistics.median(x["images_per_sec"] for x in recs[1:]))
        print(f"{which:9s} dist.sync_bn={sync:5s} img/s per round {[round(v, 2) for v in per_round]} "
              f"median {statistics.median(per_round):.2f}")
PY
