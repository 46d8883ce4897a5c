#!/usr/bin/env bash
# scripts/gpu-check.sh runs once per scarce GPU session, so its control flow is tested here,
# without a GPU: fakes of nvidia-smi, of python3 with a CUDA PyTorch, and of a carried bundle
# (tests/scripts/gpu_check_fakes: a loader and resnet/test_* that print what the real ones
# print and write the files the script reads). Checked: all passing gives exit 0, the table
# with its ratios and at most the 8 files the device tool brings back; failures each give
# their FAILED line and exit 1 while the later sections still run; no GPU exits 3 at once.
# Usage: tests/scripts/gpu_check_dry_test.sh   (ctest: scripts.GpuCheckDryRun)
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
export REAL_PYTHON=${REAL_PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GC_FAKES="$work/fakes" TMPDIR="$work/tmp"
mkdir -p "$TMPDIR"
cp -r "$src/tests/scripts/gpu_check_fakes" "$GC_FAKES"
for d in site/nvidia/cu13/lib site/torch/lib; do mkdir -p "$GC_FAKES/$d" && : > "$GC_FAKES/$d/libfake.so.1"; done
{
  echo "built 2026-11-30T00:00:00Z on test from 0000000000000000000000000000000000000000"
  echo "glibc (fake)"
} > "$GC_FAKES/bundle/MANIFEST"
tar -C "$GC_FAKES/bundle" -cJf "$work/bundle.tar.xz" bin lib MANIFEST || exit 1
export RN_GPU_BUNDLE="$work/bundle.tar.xz"
failures=0
expect() {  # expect NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok    $name"; else echo "FAIL  $name"; failures=$((failures + 1)); fi
}
# run NAME [VAR=VALUE...]: one run of the script with the fakes first on PATH.
run() {
  local name=$1; shift
  : > "$GC_FAKES/calls.log"
  env PATH="$GC_FAKES/bin:$PATH" "$@" bash "$src/scripts/gpu-check.sh" "$work/$name" > "$work/$name.out" 2>&1
  echo $? > "$work/$name.rc"
}
has() { grep -qE -- "$2" "$1"; }
rc() { [[ $(cat "$work/$1.rc") == "$2" ]]; }

run pass
expect "all passing: exit 0" rc pass 0
expect "all passing: says so" has "$work/pass.out" 'done in [0-9]+ s: all checks passed'
expect "all passing: no FAILED line" bash -c "! grep -q FAILED '$work/pass.out'"
expect "table: our eager fp16 row with its ratio to PyTorch eager and torch.compile" \
  has "$work/pass/table.md" '^\| resnet.cpp \| fp16 \| 2500 \| 0.83x \| 0.74x \| 18.00 GiB \|$'
expect "table: sink, scalar-kernel and PyTorch rows" \
  bash -c "grep -c '^| resnet.cpp-sink ' '$work/pass/table.md' | grep -qx 2 &&
           grep -q '^| resnet.cpp-scalar-kernels | fp16 ' '$work/pass/table.md' &&
           grep -q '^| pytorch-compile | bf16 | 3300 ' '$work/pass/table.md'"
sections() {  # every section header is in the output
  local s
  for s in machine binaries 'cross-backend harness' 'golden parity' 'eager vs sink' 'throughput: resnet50' table \
           NCCL diagnostics 'one element per access' 'torch.compile'; do
    grep -q "^=== \[[0-9]* s\] .*$s" "$1" || { echo "missing section: $s"; return 1; }
  done
}
expect "every section ran" sections "$work/pass.out"
expect "diag-check ran and passed" bash -c "grep -q 'diag-check: ok    doctor fp16 measured the mixed run' '$work/pass.out' &&
  ! grep -q 'diag-check: FAIL' '$work/pass.out'"
expect "at most 8 files come back, the log and the table among them" \
  bash -c "n=\$(ls '$work/pass' | wc -l); (( n <= 8 )) && [[ -s '$work/pass/gpu-check.log' && -s '$work/pass/logs.tar.gz' ]]"
expect "the golden files are made in the background by GoldenFiles.*" has "$GC_FAKES/calls.log" 'GoldenFiles'

run failures FAKE_FAIL=train_sink,bench_fp16,torch_eager_bf16,nccl
expect "failures: exit 1" rc failures 1
for line in 'FAILED: training \(sink\): exit 1' 'FAILED: resnet bench fp16: exit 1$' 'FAILED: pytorch eager bf16: exit 1' \
            'FAILED: NCCL collectives' 'eager and sink not compared: a training failed' \
            'torch.compile bf16 skipped: PyTorch eager bf16 failed' 'SOME CHECKS FAILED'; do
  expect "failures: '$line'" has "$work/failures.out" "$line"
done
expect "failures: the sections after them still ran" has "$work/failures.out" '^=== \[[0-9]+ s\] diagnostics'
expect "failures: no false disagreement from the comparison" bash -c "! grep -q 'training disagree' '$work/failures.out'"

run diagfail FAKE_FAIL=profile_fp16
expect "a failing diagnostic: reported, and the checks after it still run" \
  bash -c "grep -q 'diag-check: FAIL  profile fp16' '$work/diagfail.out' &&
           grep -q 'diag-check: ok    profile bf16' '$work/diagfail.out' &&
           grep -q 'FAILED: diag-check (diag/ is in logs.tar.gz): exit 1' '$work/diagfail.out'"

run differ FAKE_SINK_DIFFERS=1
expect "sink weights differ: reported" has "$work/differ.out" 'FAILED: eager and sink training disagree'
expect "sink weights differ: exit 1" rc differ 1

# cuDNN refusing harness cases: NCHW is refused by design; a grouped, depthwise or dilated
# convolution is a gap to record (named, not failed); a plain one is a failure.
g4=conv_k1x1_s1_p0_d1_g4_n2c16k32_9x7_nhwc_bf16 dw=conv_k3x3_s1_p1_d1_g16_n2c16k16_13x13_nhwc_bf16
dil=conv_k3x3_s1_p2_d2_g1_n2c8k8_13x13_nhwc_fp32 plain=conv_k1x1_s1_p0_d1_g1_n2c16k32_7x7_nhwc_fp16
run gaps FAKE_UNSUPPORTED=$g4,$dw,$dil,conv_k1x1_s1_p0_d1_g1_n2c16k32_7x7_nchw_fp32
expect "cuDNN gaps: exit 0" rc gaps 0
expect "cuDNN gaps: each named" bash -c "grep -q '^GAP .*: $g4: ' '$work/gaps.out' && grep -q '^GAP .*: $dw: ' '$work/gaps.out' &&
  grep -q '^GAP .*: $dil: ' '$work/gaps.out' && ! grep -q '^GAP .*_nchw_' '$work/gaps.out'"
expect "cuDNN gaps: counted in the last line" has "$work/gaps.out" 'all checks passed; cuDNN GAPS: 3 grouped'
run refused FAKE_UNSUPPORTED=$g4,$plain
expect "a plain convolution refused: exit 1" rc refused 1
expect "a plain convolution refused: named as such, the grouped one as a gap" \
  bash -c "grep -q '^\[cross-backend\] unsupported: $plain' '$work/refused.out' &&
           grep -q 'FAILED: cuda refused cases it should run' '$work/refused.out' && grep -q '^GAP .*: $g4: ' '$work/refused.out'"
# The tree's commit: from git where .git travelled, else from RN_EXPECT_COMMIT; the fake
# bundle was built from commit 000...0.
expect "the libraries as resolved are listed" has "$work/pass.out" 'libcudart.so.13 => .*/site/nvidia/cu13/lib/libcudart.so.13$'
run stale RN_EXPECT_COMMIT=1111111111111111111111111111111111111111 GIT_DIR=/nonexistent
expect "a stale bundle is named" has "$work/stale.out" 'STALE BUNDLE: built from 0{40} but this tree is 1{40}'
run unknown GIT_DIR=/nonexistent
expect "an unknown tree commit is said" has "$work/unknown.out" "this tree's commit is unknown here"

run nogpu FAKE_NOGPU=1
expect "no GPU: exit 3 at once" rc nogpu 3
expect "no GPU: says why" has "$work/nogpu.out" 'no NVIDIA GPU here'

run noprobe FAKE_FAIL=info
expect "backend does not start: exit 1 with the library path" has "$work/noprobe.out" 'the cuda backend does not start; library path'
expect "backend does not start: PyTorch's figures still measured" has "$work/noprobe/bench.jsonl" '"pytorch-eager"'

# A hang that runs into the deadline: the hung command is stopped there, and it and every
# later check are reported as not run (exit 4: nothing failed, the run is incomplete) rather
# than started with a few seconds to time out as failures.
start=$(date +%s)
run deadline RN_GPU_CHECK_DEADLINE=30 FAKE_HANG=harness
took=$(( $(date +%s) - start ))
expect "deadline: the hung harness stopped at the deadline, not after its own 180 s (took ${took} s)" \
  bash -c "(( $took < 75 ))"
for line in 'NOT RUN: cross-backend harness on cuda: stopped at the deadline' \
            'NOT RUN: golden parity on cuda: not started: past the deadline' 'NOT RUN: training \(eager\)' \
            'NOT RUN: resnet bench bf16 sink' 'NOT RUN: NCCL collectives' 'NOT RUN: diag-check: under 60 s' \
            'every check that ran passed; NOT RUN \(past the deadline\): cross-backend harness on cuda; golden parity'; do
  expect "deadline: '$line'" has "$work/deadline.out" "$line"
done
expect "deadline: no FAILED line" bash -c "! grep -q 'FAILED' '$work/deadline.out'"
expect "deadline: exit 4" rc deadline 4
expect "deadline: the 'not started' notes stay out of bench.jsonl" bash -c "! grep -q 'not started' '$work/deadline/bench.jsonl'"

# A wedged driver: nvidia-smi does not answer. A failure (exit 1), not "no GPU" (exit 3).
run wedged FAKE_HANG=smi
expect "wedged driver: exit 1" rc wedged 1
expect "wedged driver: says so" has "$work/wedged.out" 'nvidia-smi -L did not answer in 30 s'

if ((failures)); then
  echo "gpu_check_dry_test: $failures check(s) failed; outputs:"
  for f in "$work"/*.out; do echo "---- $f"; tail -40 "$f"; done
  exit 1
fi
echo "gpu_check_dry_test: all checks passed"
