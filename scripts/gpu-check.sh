#!/usr/bin/env bash
# The GPU verification of the CUDA backend, in one run (under 8 minutes on an H200):
#
#   scripts/gpu-check.sh OUT_DIR
#
#   1. our kernels called directly (CudaKernels.*, CudaFusedStep.*, CudaAugment.*: the tests
#      CI runs in the CPU emulation as *OnCpu.*), then the cross-backend op harness, cuda
#      against ref (fp32, fp16, bf16), and synchronised BN on cuda against one whole batch;
#   2. the golden parity tests on cuda: fp32 against torchvision with the fp32 bound,
#      fp16 and bf16 within their bounds;
#   3. a short training (resnet20, synthetic 32x32 images, O2 fp16) in eager mode and in
#      sink mode (CUDA graph replay), in high_precision mode (deterministic algorithms),
#      whose final weights must be identical;
#   4. `resnet bench` resnet50 224x224 batch 256 O2 fp16 and bf16, eager and sink, and the
#      same step in PyTorch eager (torchvision resnet50, channels_last, autocast, fused SGD);
#   5. one table: images/s, the ratios to PyTorch eager, peak device memory; then NCCL's
#      one-rank collectives and the device gradient reducer on the GPU (test_dist Nccl.*);
#   6. the troubleshooting tools on the GPU (scripts/diag-check.sh): NVML device samples,
#      the doctor's measured fp16/bf16 runs, the per-layer profile adding up;
#   7. our fp16 step with RN_CUDA_VECTOR_KERNELS=0 (one element per access), then PyTorch with
#      torch.compile in what is left of the budget (the table is made again with them).
# Every command has a time limit and the script a deadline (465 s): a hang costs its own
# section, not the run, and a check the deadline leaves no time for, or stops, is reported as
# NOT RUN (not as a failure). The results are copied to OUT_DIR every 15 s as well, so a run
# the device tool stops still returns the section it was in.
# Exit status: 0 all checks ran and passed, 1 some failed, 3 no GPU here, 4 none failed but
# the deadline kept some from running or stopped them. The two measurements made last (one
# element per access, torch.compile) run only in what time is left and are not checks: their
# absence leaves the status alone.
# The full log goes to OUT_DIR/gpu-check.log and the table to OUT_DIR/table.md.
#
# Binaries: gpu-bundle/bundle.tar.xz (scripts/gpu-bundle.sh, made on a development machine
# and carried here) when present; else build/ if it has the CUDA backend; else it builds
# (which needs the project's -dev packages). CUDA libraries: the nvidia/* folders of
# Python's site-packages (PyTorch's wheels) first, then /usr/local/cuda. See docs/gpu.md.
# RN_EXPECT_COMMIT: the commit of the tree (the device tool carries no .git), so that a
# bundle built from another commit is named as stale.
# Without a GPU it stops at once with a message (exit 3).
#
# OUT_DIR receives at most 8 small files (what the device tool brings back: at most 8 files,
# 2 folders deep): gpu-check.log, table.md, bench.jsonl, harness.log, golden.log, nccl.log,
# diag-check.log and logs.tar.gz (the training and diagnostics logs, JSON reports and the
# cuDNN algorithm cache). Everything else (the unpacked bundle, golden files of hundreds of
# MB, checkpoints, the torch.compile cache) stays in a scratch folder under /tmp.
set -uo pipefail
result=${1:?usage: scripts/gpu-check.sh OUT_DIR}
mkdir -p "$result" && result=$(cd "$result" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }
# What comes back: 8 files at most, small ones. Published at every section too, so that a run
# stopped at the device tool's time limit still returns what it had done.
publish() {
  local f tmp="$out/.logs.$BASHPID.tgz"  # one per caller: the 15-s publisher and section() may overlap
  for f in gpu-check.log table.md bench.jsonl harness.log golden.log nccl.log diag-check.log; do
    [[ -f $out/$f ]] && cp "$out/$f" "$result/$f"
  done
  (cd "$out" && find . -maxdepth 4 -type f \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' -o -name '*.tsv' \
    -o -name '*.md' \) -size -4M ! -name gpu-check.log -print0 | tar czf "$tmp" --null -T -) 2>/dev/null
  cp "$tmp" "$result/logs.tar.gz" 2>/dev/null; rm -f "$tmp"
  return 0
}
section() { publish; echo; echo "=== [$(elapsed) s] $*"; }
status=0
not_run=""
gap_note=""  # cuDNN's refusals of grouped, depthwise or dilated convolutions: recorded, not failed
fail() { echo "FAILED: $*"; status=1; }
# Seconds left before the script's own deadline (the device tool kills at timeout_s=540).
deadline=${RN_GPU_CHECK_DEADLINE:-465}  # another only in tests (tests/scripts)
left() { echo $(( deadline - $(elapsed) )); }
# limited N CMD...: CMD under a time limit of N s, never past the deadline (SIGKILL 10 s
# after SIGTERM if it ignores that). With under 5 s left it is not started at all (exit 200);
# one stopped by the deadline rather than by its own limit exits 201.
limited() {
  local l want=$1; shift
  l=$(left)
  if (( l < 5 )); then echo "not started: under 5 s before the script's ${deadline}-s deadline" >&2; return 200; fi
  (( l > want )) && l=$want
  timeout -k 10 "$l" "$@"
  local rc=$?
  (( rc == 124 && l < want )) && return 201
  return $rc
}
# Why a command failed: its exit status, its time limit, or the deadline.
why() {
  case $1 in
    124) echo "timed out" ;; 200) echo "not started: past the deadline" ;; 201) echo "stopped at the deadline" ;;
    *) echo "exit $1" ;;
  esac
}
# failed RC WHAT: a check that failed, or one the deadline kept from running or stopped
# (RC 200 or 201, and the deadline near indeed: a command's own exit 200 stays a failure).
failed() {
  local rc=$1; shift
  if [[ $rc == 200 || $rc == 201 ]] && (( $(left) < 5 )); then
    echo "NOT RUN: $*: $(why "$rc")"; not_run+="${not_run:+; }$*"
  else fail "$*: $(why "$rc")"; fi
}

checks() {
# nvidia-smi and the first CUDA calls get a limit as well: a wedged driver hangs them.
smi() { timeout -k 5 30 nvidia-smi "$@"; }
gpus=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(smi -L 2>&1); smi_rc=$?
  if [[ $smi_rc == 124 || $smi_rc == 137 ]]; then
    echo "gpu-check: nvidia-smi -L did not answer in 30 s (a wedged driver?): nothing can run"; return 1
  fi
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || (( $(grep -c '^GPU' <<< "$gpus") == 0 )); then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi missing or lists none); nothing to check."
  return 3
fi
section "machine"
date -u
smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
echo "network interfaces: $(ls /sys/class/net 2>/dev/null | tr '\n' ' ')"
gpu_name=$(smi --query-gpu=name --format=csv,noheader | head -1)
driver=$(smi --query-gpu=driver_version --format=csv,noheader | head -1)
git log -1 --format='commit %H %s' 2>/dev/null || true
py=$(command -v python3 || true)
[[ -n $py ]] && timeout -k 5 60 "$py" -c 'import torch, torchvision; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "torchvision", torchvision.__version__)' || echo "no PyTorch"

# ---- CUDA library folders ------------------------------------------------------------------
libdirs=()
add_dir() {
  [[ -d $1 ]] && compgen -G "$1/*.so*" >/dev/null || return 0
  local d; for d in "${libdirs[@]}"; do [[ $d == "$1" ]] && return 0; done
  libdirs+=("$1")
}
# The driver (libcuda.so.1, libnvidia-ml.so.1) is loaded at run time, so the missing-library
# check below cannot see it: its folder must be on the path the bundled loader searches,
# which replaces LD_LIBRARY_PATH. On the H200 machines it is a mount at /usr/local/nvidia.
for lib in libcuda.so.1 libnvidia-ml.so.1; do
  d=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
  [[ -n $d ]] && add_dir "$(dirname "$d")"
done
add_dir /usr/local/nvidia/lib64
add_dir /usr/local/nvidia/lib
# Then PyTorch's wheels (cuDNN, cuBLAS, NCCL, the CUDA runtime) before the toolkit's folder:
# the first folder holding a soname wins for the whole process, cuDNN's own dlopen of
# cuBLASLt and NVRTC included, and the wheels' cuDNN is built to pair with the wheels'
# cuBLAS (its RUNPATH names them). That set is the one PyTorch runs with on this machine.
if [[ -n $py ]]; then
  site=$(timeout -k 5 60 "$py" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || true)
  if [[ -n $site ]]; then
    for d in "$site"/nvidia/cu*/lib "$site"/nvidia/*/lib "$site"/nvidia/*/lib64; do add_dir "$d"; done
  fi
  tlib=$(timeout -k 5 60 "$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null || true)
  [[ -n $tlib ]] && add_dir "$tlib"
fi
IFS=: read -r -a ld_dirs <<< "${LD_LIBRARY_PATH:-}"
for d in "${ld_dirs[@]}"; do [[ -n $d ]] && add_dir "$d"; done
add_dir /usr/local/cuda/lib64
cuda_path=$(IFS=:; echo "${libdirs[*]}")
echo "CUDA library folders: $cuda_path"

# ---- binaries -------------------------------------------------------------------------------
section "binaries"
run=()  # the prefix that starts one of our binaries
bin=""
bundle=${RN_GPU_BUNDLE:-gpu-bundle/bundle.tar.xz}  # another only in tests (tests/scripts)
if [[ -f $bundle ]]; then
  b="$out/bundle"
  rm -rf "$b" && mkdir -p "$b"
  if ! tar -C "$b" -xJf "$bundle" 2>"$out/untar.log"; then
    cat "$out/untar.log"; echo "tar -xJ failed (no xz here?): unpacking with Python's tarfile"
    rm -rf "$b" && mkdir -p "$b"
    "${py:-python3}" -c 'import sys, tarfile; t = tarfile.open(sys.argv[1]); t.extractall(sys.argv[2], **({"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}))' "$bundle" "$b" \
      || { echo "cannot unpack $bundle"; return 1; }
  fi
  [[ -f $b/MANIFEST ]] && compgen -G "$b/lib/ld-linux*.so*" >/dev/null || { echo "$bundle lacks MANIFEST or lib/ld-linux*"; return 1; }
  head -3 "$b/MANIFEST"
  bundled=$(head -1 "$b/MANIFEST" | sed -n 's/.* from \([0-9a-f]\{40\}\).*/\1/p')
  # The device tool copies the working tree without .git: the caller names the commit the
  # tree is at (RN_EXPECT_COMMIT=$(git rev-parse HEAD), docs/gpu.md) so that a stale bundle shows.
  here=$(git rev-parse HEAD 2>/dev/null || true)
  [[ -z $here ]] && here=${RN_EXPECT_COMMIT:-}
  if [[ -z $here ]]; then
    echo "WARNING: this tree's commit is unknown here (no .git, no RN_EXPECT_COMMIT): the bundle (from ${bundled:-?}) may test other code"
  elif [[ -n $bundled && $bundled != "$here"* ]]; then
    echo "WARNING: STALE BUNDLE: built from $bundled but this tree is $here: it tests other code (rebuild it: docs/gpu.md)"
  else
    echo "the bundle was built from this tree's commit ($here)"
  fi
  loader=$(ls "$b"/lib/ld-linux*.so* | head -1)
  bin="$b/bin"
  run=("$loader" --library-path "$b/lib:$cuda_path")
elif [[ -x build/resnet ]] && nm -C build/resnet 2>/dev/null | grep make_cuda_backend >/dev/null; then
  bin="$root/build" ; export LD_LIBRARY_PATH="$cuda_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "no carried bundle and no CUDA build: building here"
  cmake --preset default -DRN_CUDA=ON && cmake --build build -j"$(nproc)" --target resnet test_ops test_model test_dist || { echo "build failed"; return 1; }
  bin="$root/build"; export LD_LIBRARY_PATH="$cuda_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
resnet_bin=$bin/resnet; [[ -x $bin/resnet ]] || resnet_bin=$bin/../resnet
test_ops=$bin/test_ops; [[ -x $test_ops ]] || test_ops=$bin/tests/test_ops
test_model=$bin/test_model; [[ -x $test_model ]] || test_model=$bin/tests/test_model
test_dist=$bin/test_dist; [[ -x $test_dist ]] || test_dist=$bin/tests/test_dist
# Every command has a time limit (a hang must not take the whole run): `limit=N resnet ...`
# sets resnet's (default 150 s), never past the deadline.
resnet() { limited "${limit:-150}" "${run[@]}" "$resnet_bin" "$@"; }
if ((${#run[@]})); then
  missing=$(timeout -k 5 60 "${run[0]}" --list --library-path "${run[2]}" "$resnet_bin" 2>&1 | grep 'not found' || true)
else
  missing=$(timeout -k 5 60 ldd "$resnet_bin" | grep 'not found' || true)
fi
if [[ -n $missing ]]; then
  echo "libraries not found (install them or add their folder):"; echo "$missing"; return 1
fi
# Which files the CUDA libraries (and oneDNN) resolve to, as the loader finds them.
echo "libraries as resolved:"
if ((${#run[@]})); then
  timeout -k 5 60 "${run[0]}" --list --library-path "${run[2]}" "$resnet_bin" 2>&1
else
  timeout -k 5 60 ldd "$resnet_bin" 2>&1
fi | grep -E 'cudnn|cublas|nccl|cudart|dnnl' | sed 's/ (0x[0-9a-f]*)$//'

# The build and the libraries as loaded here: CUDA runtime and driver, cuDNN, cuBLAS, NCCL.
limit=30 resnet --version || true
# Does the cuda backend start at all? (A driver the loader cannot find shows here, not as a
# hundred skipped tests.)
if ! limit=60 resnet info --device cuda --model resnet20 --input 3x32x32 --classes 10 --batch 2 > "$out/probe.log" 2>&1; then
  cat "$out/probe.log"
  echo "the cuda backend does not start; library path: ${run[2]:-$LD_LIBRARY_PATH}"
  # What the loader did (probe-lddebug.log, in logs.tar.gz), and PyTorch's figures, which
  # need none of our binaries, so that the run still brings back something to go on.
  LD_DEBUG=libs limit=60 resnet info --device cuda --model resnet20 --input 3x32x32 --classes 10 --batch 2 \
    > "$out/probe-lddebug.log" 2>&1
  [[ -n $py ]] && for half in fp16 bf16; do
    limited 120 "$py" bench/torch_gpu_step.py --half $half | tee -a "$out/bench.jsonl"
  done
  return 1
fi
grep -m1 "cuda backend:" "$out/probe.log" || true
export RN_CUDNN_ALGO_CACHE="$out/cudnn_algos.tsv"
# The cache an earlier run brought back (docs/gpu.md), if one was committed, saves the cuDNN
# searches; its keys name the GPU and the cuDNN version, so entries for another are unused.
seed="$root/bench/gpu/cudnn_algos.tsv"
if [[ -f $seed ]]; then
  cp "$seed" "$RN_CUDNN_ALGO_CACHE" && echo "cuDNN algorithm cache seeded from bench/gpu/cudnn_algos.tsv ($(grep -vc '^#' "$seed") entries)"
fi
export RN_PYTHON=${py:-/usr/bin/python3} RN_SOURCE_DIR="$root" RN_GOLDEN_DIR="$out/golden"
mkdir -p "$RN_GOLDEN_DIR"
# The golden files (tools/golden.py on the CPU, about a minute) are made while the harness runs
# on the GPU, by the test that only makes them (GoldenFiles.*: the cases of the parity tests),
# on half the cores: the harness computes its reference on the CPU under its own time limit.
golden_pid=""
if [[ -n $py ]]; then
  half_cores=$(( ($(nproc) + 1) / 2 ))
  OMP_NUM_THREADS=$half_cores MKL_NUM_THREADS=$half_cores \
    limited 240 "${run[@]}" "$test_model" --gtest_filter='GoldenFiles.*' > "$out/golden-gen.log" 2>&1 &
  golden_pid=$!
fi

# ---- 1. harness, 2. goldens ---------------------------------------------------------------
section "cross-backend harness: cuda vs ref"
# Our kernels called directly first (vector and one-element paths, unaligned buffers,
# statistics against sums in double, the fused step and the augmentation against the host
# bit for bit), in a process of their own: a kernel fault leaves a sticky CUDA error that
# would fail every later test of the same process. CI runs the same tests in the CPU
# emulation (test_cuda_sim): a failure here that passes there is the GPU's own.
kernel_tests='CudaKernels.*:CudaFusedStep.*:CudaAugment.*'
limited 120 "${run[@]}" "$test_ops" --gtest_filter="$kernel_tests:ChannelTiling.*:VectorElems.*:RowSplits.*" 2>&1 \
  | tee "$out/harness.log"
krc=${PIPESTATUS[0]}
[[ $krc == 0 ]] || failed "$krc" "our CUDA kernels ($kernel_tests)"
if [[ $krc != 0 && $krc != 200 ]]; then
  # A fault (not a wrong value): which kernel, which line, from the same tests under
  # compute-sanitizer's memcheck (the backend is built with -lineinfo). It works on
  # Firecracker machines, not under gVisor. Only its own report lines come back.
  san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  if [[ $(uname -r) == 4.4.0 ]]; then  # gVisor's kernel version: the sanitizer cannot attach there
    echo "compute-sanitizer not run: this machine runs under gVisor, where it refuses the device"
  elif [[ -n $san ]] && grep -qiE 'illegal|misaligned|launch failure|out of bounds|CUDA call .* failed' "$out/harness.log"; then
    echo "rerunning $kernel_tests under $san (memcheck)" | tee -a "$out/harness.log"
    limited 120 "$san" --tool memcheck --print-limit 5 "${run[@]}" "$test_ops" --gtest_filter="$kernel_tests" 2>&1 \
      | grep -E '^=========|FAILED|Failure' | head -150 | tee -a "$out/harness.log"
  fi
fi
limited 180 "${run[@]}" "$test_ops" \
  --gtest_filter='Ops/CrossBackendCuda.*:Cases/SyncBatchNorm*cuda*:FusedMath.*:FusedStepDesc.*:CudnnAlgoCache.*' \
  --gtest_brief=1 2>&1 | tee -a "$out/harness.log"
hrc=${PIPESTATUS[0]}
[[ $hrc == 0 ]] || failed "$hrc" "cross-backend harness on cuda"
# On a GPU machine a skip for "no usable GPU" means the backend did not start: a failure.
grep -qE 'cuda backend not run|cuda kernels not run' "$out/harness.log" && fail "the cuda backend did not start (see harness.log)"
# The backend refuses NCHW by design; any other unsupported case is a finding, not a pass.
# A grouped, depthwise or dilated convolution that cuDNN has no engine for (which only a GPU
# can tell) is a gap to record in docs/gpu.md: resnet50_gdw needs grouped and depthwise
# convolutions, resnet18..152 none. Any other refusal (groups 1, dilation 1, or not a
# convolution) is a failure: ResNet-50 itself needs it.
unsupported=$(grep '^\[cross-backend\] unsupported: ' "$out/harness.log" | grep -v '_nchw' || true)
gaps=$(grep -E 'unsupported: conv_k[0-9x]+_s[0-9x]+_p[0-9x]+_d[0-9x]+_g[0-9]+_' <<< "$unsupported" \
  | grep -vE '_d1_g1_' || true)
refused=$(grep -vxF -f <(printf '%s\n' "$gaps") <<< "$unsupported" | grep . || true)
[[ -z $gaps ]] && refused=$unsupported
if [[ -n $gaps ]]; then
  echo "$gaps" | sed 's/^\[cross-backend\] unsupported: /GAP (grouped, depthwise or dilated; record it in docs\/gpu.md): /'
  gap_note="; cuDNN GAPS: $(grep -c . <<< "$gaps") grouped, depthwise or dilated convolution case(s) refused (the GAP lines in gpu-check.log)"
  echo "GAP: cuDNN refused $(grep -c . <<< "$gaps") grouped, depthwise or dilated convolution case(s) (above): resnet50_gdw may not train on this GPU"
fi
if [[ -n $refused ]]; then echo "$refused"; fail "cuda refused cases it should run (above)"; fi
section "golden parity on cuda (fp32, fp16, bf16)"
[[ -n $golden_pid ]] && { wait "$golden_pid" || { tail -5 "$out/golden-gen.log"; echo "golden generation in the background failed (golden-gen.log); the parity tests make what is missing"; }; }
limited 240 "${run[@]}" "$test_model" --gtest_filter='Zoo/GoldenParity.*cuda*:Zoo/GoldenParityHalf.*' 2>&1 \
  | tee "$out/golden.log"
grc=${PIPESTATUS[0]}
[[ $grc == 0 ]] || failed "$grc" "golden parity on cuda"
grep -qE 'golden not run|not importable' "$out/golden.log" && fail "golden parity did not run on cuda (see golden.log)"
# ---- 3. eager vs sink -----------------------------------------------------------------------
section "short training: eager vs sink (resnet20, synthetic, O2 fp16, high_precision)"
train_set=(--set model.name=resnet20 --set model.in_channels=3 --set model.num_classes=10
  --set model.image_size=[32,32] --set data.dataset=synthetic --set data.train_subset=2560
  --set data.val_subset=256 --set data.batch_size=64 --set data.mean=[0.5,0.5,0.5] --set data.std=[0.25,0.25,0.25]
  --set schedule.epochs=1 --set precision.level=O2 --set precision.half_dtype=fp16
  --set run.device=cuda --set run.implementation_mode=high_precision --set run.log_interval_steps=10
  --set run.checkpoint.keep_best=false)
trained=1
for mode in eager sink; do
  sink=0; [[ $mode == sink ]] && sink=10
  rm -rf "$out/train_$mode"
  limit=120 resnet train "${train_set[@]}" --set run.sink_size=$sink --set run.out_dir="$out/train_$mode"
  trc=$?
  [[ $trc == 0 ]] || { failed "$trc" "training ($mode)"; trained=0; }
done
if [[ $trained == 0 ]]; then
  echo "eager and sink not compared: a training failed or did not run"
elif [[ -z $py ]]; then
  fail "eager and sink not compared: no python3 for tools/compare_checkpoints.py"
else
  limited 120 "$py" "$root/tools/compare_checkpoints.py" "$out"/train_eager/checkpoints "$out"/train_sink/checkpoints
  crc=$?
  if [[ $crc == 1 ]]; then fail "eager and sink training disagree (the comparison's output is above)"
  elif [[ $crc != 0 ]]; then failed "$crc" "the eager and sink checkpoint comparison"; fi
fi

# ---- 4. throughput ----------------------------------------------------------------------------
section "throughput: resnet50 224x224 batch 256"
bench_json="$out/bench.jsonl"; : > "$bench_json"
for half in fp16 bf16; do
  # The first run of each half also searches cuDNN's algorithms (then cached for the others).
  limit=200 resnet bench --device cuda --model resnet50 --batch 256 --precision O2 --half $half --steps 30 --warmup 5 --json \
    | tee -a "$bench_json"
  brc=${PIPESTATUS[0]}
  [[ $brc == 0 ]] || failed "$brc" "resnet bench $half"
  resnet bench --device cuda --model resnet50 --batch 256 --precision O2 --half $half --steps 30 --warmup 3 --sink 10 \
    --json | sed 's/"system":"resnet.cpp"/"system":"resnet.cpp-sink"/' | tee -a "$bench_json"
  brc=${PIPESTATUS[0]}
  [[ $brc == 0 ]] || failed "$brc" "resnet bench $half sink"
done
torch_failed=""
if [[ -n $py ]]; then
  for half in fp16 bf16; do
    limited 150 "$py" bench/torch_gpu_step.py --half $half | tee -a "$bench_json"
    prc=${PIPESTATUS[0]}
    [[ $prc == 0 ]] || { failed "$prc" "pytorch eager $half"; torch_failed+=" $half"; }
  done
else
  fail "no python3 here: the PyTorch baseline, the table and the checkpoint comparison cannot run"
fi

# ---- 5. table -------------------------------------------------------------------------------------
make_table() {
[[ -n $py ]] || return 0
timeout -k 5 60 "$py" - "$bench_json" "$gpu_name" "$driver" > "$out/table.md" <<'PY' || fail "table.md (from bench.jsonl)"
import json, sys
rows = []
for l in open(sys.argv[1]):
    try:
        r = json.loads(l)
    except ValueError:
        continue
    if isinstance(r, dict) and "system" in r and "images_per_sec" in r:
        rows.append(r)
print(f"GPU: {sys.argv[2]}, driver {sys.argv[3]}; resnet50, 224x224, batch 256, O2 / autocast\n")
print("| system | half | img/s | vs PyTorch eager | vs torch.compile | peak device memory |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for r in rows:
    half = r.get("half")
    eager = next((x["images_per_sec"] for x in rows if x["system"] == "pytorch-eager" and x.get("half") == half), None)
    comp = next((x["images_per_sec"] for x in rows if x["system"] == "pytorch-compile" and x.get("half") == half), None)
    ips = r["images_per_sec"]
    f = lambda ref: f"{ips / ref:.2f}x" if ref else "-"
    print(f"| {r['system']} | {half} | {ips:.0f} | {f(eager)} | {f(comp)} | {r.get('device_peak', 0) / 2**30:.2f} GiB |")
PY
cat "$out/table.md"
}
section "table"
make_table

section "NCCL on one GPU (one-rank collectives and the device gradient reducer)"
# NCCL has never run on these machines: loopback only (one rank needs nothing else), and a
# time limit, since its set-up (sockets, PCI topology) has none of its own.
if [[ -x $test_dist ]]; then
  NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=lo limited 120 "${run[@]}" "$test_dist" --gtest_filter='Nccl.*' 2>&1 \
    | tee "$out/nccl.log"
  nrc=${PIPESTATUS[0]}
  [[ $nrc == 0 ]] || failed "$nrc" "NCCL collectives on the GPU"
  grep -q 'no GPU: the NCCL collectives are not run' "$out/nccl.log" && fail "the NCCL test did not reach the GPU (see nccl.log)"
else
  echo "no test_dist binary in this bundle: NCCL not checked"
fi

# ---- 6. the troubleshooting tools on the GPU (issue 7), after the table so it is never lost -----
section "diagnostics: device monitor (NVML), doctor fp16/bf16, per-layer profile (scripts/diag-check.sh)"
if (( $(left) < 60 )); then
  echo "NOT RUN: diag-check: under 60 s before the deadline ($(elapsed) s used of ${deadline}; run scripts/diag-check.sh on its own)"
  not_run+="${not_run:+; }diag-check"
else
  printf '#!/usr/bin/env bash\nexec %s "$@"\n' "$(printf '%q ' "${run[@]}" "$resnet_bin")" > "$out/resnet.sh"
  chmod +x "$out/resnet.sh"
  # The profiles take the benchmark's batch and half types, whose cuDNN searches are cached.
  RN_RESNET="$out/resnet.sh" DIAG_OUT="$out/diag" PROFILE_ARGS="--model resnet50 --batch 256" PROFILE_DTYPES="fp16 bf16" \
    limited 300 scripts/diag-check.sh "$bin" cuda \
    2>&1 | tee "$out/diag-check.log"
  drc=${PIPESTATUS[0]}
  [[ $drc == 0 ]] || failed "$drc" "diag-check (diag/ is in logs.tar.gz)"
fi

# What the 16-byte accesses of our kernels bring: the same step with them off (docs/gpu.md).
section "throughput with one element per access (RN_CUDA_VECTOR_KERNELS=0)"
if (( $(left) > 60 )); then
  RN_CUDA_VECTOR_KERNELS=0 limit=90 resnet bench --device cuda --model resnet50 --batch 256 --precision O2 --half fp16 \
    --steps 30 --warmup 5 --json | sed 's/"system":"resnet.cpp"/"system":"resnet.cpp-scalar-kernels"/' \
    | tee -a "$bench_json" || fail "resnet bench fp16 with RN_CUDA_VECTOR_KERNELS=0"
else
  echo "bench with RN_CUDA_VECTOR_KERNELS=0 skipped: $(elapsed) s used of the ${deadline}-s budget"
fi

# ---- 7. torch.compile last: the most expensive step (minutes of Inductor/Triton compilation,
# a recompile in the first steps) and the least about our code, bounded by the deadline --------
if [[ -n $py ]]; then
  section "PyTorch torch.compile (what is left of the budget)"
  for half in fp16 bf16; do
    if (( $(left) < 90 )); then echo "torch.compile $half skipped: $(elapsed) s used of the ${deadline}-s budget"; continue; fi
    if [[ $torch_failed == *$half* ]]; then echo "torch.compile $half skipped: PyTorch eager $half failed"; continue; fi
    TORCHINDUCTOR_CACHE_DIR="$out/inductor" limited 400 "$py" bench/torch_gpu_step.py --half $half --compile --warmup 3 \
      | tee -a "$bench_json"
    crc=${PIPESTATUS[0]}
    if [[ $crc == 124 || $crc == 200 || $crc == 201 ]]; then echo "torch.compile $half stopped at the deadline: not measured"
    elif [[ $crc != 0 ]]; then fail "pytorch compile $half (exit $crc)"; fi
  done
  make_table
fi
if [[ $status != 0 ]]; then
  section "done in $(elapsed) s: SOME CHECKS FAILED${not_run:+ (and not run, past the deadline: $not_run)}$gap_note"
elif [[ -n $not_run ]]; then
  section "done in $(elapsed) s: every check that ran passed; NOT RUN (past the deadline): $not_run$gap_note"
  status=4
else
  section "done in $(elapsed) s: all checks passed$gap_note"
fi
return $status
}

# Copies the results every 15 s too, so that a command killed at the device tool's limit
# still returns the section it was in. Its output is not the script's: a `sleep` left
# running after the kill below must not hold the caller's pipe open.
( while sleep 15; do publish; done ) > /dev/null 2>&1 < /dev/null & pub_pid=$!
checks 2>&1 | tee "$out/gpu-check.log"
rc=${PIPESTATUS[0]}
kill "$pub_pid" 2>/dev/null; wait "$pub_pid" 2>/dev/null
publish
if [[ $rc == 3 ]]; then  # no GPU: nothing in the scratch folder but the log, copied already
  rm -rf "$out"
  echo "gpu-check: results in $result ($(ls "$result" | tr '\n' ' '))"
  exit $rc
fi
echo "gpu-check: results in $result ($(ls "$result" | tr '\n' ' ')); scratch $out"
exit $rc
