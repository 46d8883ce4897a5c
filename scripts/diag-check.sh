#!/usr/bin/env bash
# Runs the troubleshooting tools (docs/troubleshooting.md) on this machine's device and
# checks what only a GPU can show: NVML loaded at run time (power, clocks, temperature,
# utilisation, memory in metrics.jsonl), the doctor's measured fp16 run (not only the
# analytic ranges), and the per-layer profile's peaks and consistency on the GPU.
# scripts/gpu-check.sh calls it; it works on a CPU-only machine too (DEVICE=cpu).
# Usage: [RN_RESNET=COMMAND] [DIAG_OUT=DIR] scripts/diag-check.sh [BUILD_DIR=build] [DEVICE=cuda]
#   PROFILE_ARGS="--model resnet20 --input 3x32x32 --classes 10 --batch 32" for a quick CPU smoke run;
#   PROFILE_DTYPES="fp16 bf16" for other profiled types than fp32 and bf16 (gpu-check.sh profiles
#   the batch and types of its benchmark, whose cuDNN algorithm searches are then cached)
# Exit status: non-zero when a tool fails or a check below does not hold.
set -uo pipefail  # no -e: a failing tool is reported by the checks after it, and the rest still run
cd "$(dirname "$0")/.."
build="${1:-build}"
device="${2:-cuda}"
bin="${RN_RESNET:-$build/resnet}"  # gpu-check.sh passes a wrapper that starts the carried bundle
out="${DIAG_OUT:-$build/diag-check}"
rm -rf "$out" && mkdir -p "$out"
fail=0
check() { if eval "$2"; then echo "diag-check: ok    $1"; else echo "diag-check: FAIL  $1"; fail=1; fi; }
small=(--set model.image_size=[32,32] --set data.dataset=synthetic --set model.in_channels=3
       --set "data.mean=[0.5,0.5,0.5]" --set "data.std=[0.25,0.25,0.25]" --set data.train_subset=4096
       --set data.val_subset=256 --set data.batch_size=128 --set run.device="$device")

# 1. Device monitor and gradient monitor in a short run: on a GPU the samples must carry NVML fields.
"$bin" train "${small[@]}" --set schedule.epochs=1 --set run.out_dir="$out/run" \
  --set diagnostics.grad_monitor_interval=8 --set diagnostics.device_monitor_interval=0.5 >"$out/train.log" 2>&1
check "training run with monitors" "[ -s $out/run/grad_summary.jsonl ]"
if [ "$device" = cuda ]; then
  check "NVML samples (power_w, sm_clock_mhz) in metrics.jsonl" \
    "grep '\"kind\":\"device\"' $out/run/metrics.jsonl | grep -q power_w && grep -q sm_clock_mhz $out/run/metrics.jsonl"
fi
grep -E "device monitor|throughput:|throughput variance" "$out/run/train.log" || true
if [ "$device" = cuda ]; then
  # Sink mode: steps between host synchronisations are analysed as one sample, so the periodic
  # sync must not read as variance.
  "$bin" train "${small[@]}" --set schedule.epochs=1 --set run.out_dir="$out/run_sink" --set run.sink_size=8 \
    --set diagnostics.variance_window=11 >"$out/train_sink.log" 2>&1
  check "sink-mode run ends with a throughput summary" "grep -q 'throughput: step time' $out/run_sink/train.log"
  check "sink mode: no host-synchronisation variance warning" \
    "! grep -q 'likely cause: host synchronisation' $out/run_sink/train.log"
fi

# 2. The doctor: fp16 actually runs on a GPU; bf16 too. Exit 2 means a threshold was passed (reported, not an error).
for half in fp16 bf16; do
  "$bin" doctor "${small[@]}" --set precision.level=O2 --set precision.half_dtype=$half --steps 3 \
    --json "$out/doctor_$half.json" >"$out/doctor_$half.log" 2>&1
  rc=$?  # no set -e here: it would stay on and end the script at the first failing profile or summary
  check "doctor $half ran (exit $rc)" "[ $rc -eq 0 ] || [ $rc -eq 2 ]"
  [ "$device" = cuda ] && check "doctor $half measured the mixed run" "grep -q '\"mixed_ran\": true' $out/doctor_$half.json"
  grep -E "verdict|overflow-skipped|all tensors" "$out/doctor_$half.log" || true
done

# 3. The per-layer profile of ResNet-50: peaks, table, trace, consistency with the measured step.
for dtype in ${PROFILE_DTYPES:-fp32 bf16}; do
  # shellcheck disable=SC2086
  "$bin" profile ${PROFILE_ARGS:---model resnet50 --batch 64} --dtype $dtype --device "$device" --steps 5 --top 15 \
    --json "$out/profile_$dtype.json" --trace "$out/profile_trace_$dtype.json" >"$out/profile_$dtype.log" 2>&1
  cat "$out/profile_$dtype.log"
  check "profile $dtype: layers + optimizer within the stated margin of the measured step" \
    "grep -q '\"consistent\": true' $out/profile_$dtype.json"
done

# 4. Summary: compares the run with itself (must agree).
"$bin" summary "$out/run" "$out/run" >"$out/summary.log" 2>&1
check "summary of a run against itself agrees" "grep -q 'the runs agree' $out/summary.log"

# 5. CPU against GPU: the same fp32 steps from the same weights and batches on oneDNN and on
# the device (whose input path crops, flips and normalises raw u8 batches there), compared
# tensor by tensor by the gradient monitor. They must agree at step 1; rounding may make
# them drift apart later (the first divergence is printed, not failed).
if [ "$device" = cuda ]; then
  for dev in cpu cuda; do
    "$bin" train --set model.image_size=[32,32] --set data.dataset=synthetic --set model.in_channels=3 \
      --set "data.mean=[0.5,0.5,0.5]" --set "data.std=[0.25,0.25,0.25]" --set data.train_subset=512 \
      --set data.val_subset=128 --set data.batch_size=128 --set schedule.epochs=1 --set precision.level=O0 \
      --set run.device=$dev --set diagnostics.grad_monitor_interval=1 --set run.out_dir="$out/fp32_$dev" \
      >"$out/train_fp32_$dev.log" 2>&1 || echo "diag-check: training fp32 on $dev failed (see $out/train_fp32_$dev.log)"
  done
  "$bin" summary "$out/fp32_cpu" "$out/fp32_cuda" --tolerance 1e-3 >"$out/summary_cpu_cuda.log" 2>&1 || true
  head -n 3 "$out/summary_cpu_cuda.log"
  check "CPU and GPU fp32 runs agree at step 1 (every tensor's norms within 1e-3)" \
    "grep -q 'the runs agree' $out/summary_cpu_cuda.log || grep -Eq 'first divergence at step ([2-9]|[1-9][0-9]+) ' $out/summary_cpu_cuda.log"
fi
exit $fail
