# Sourced by the fakes. GC_FAKES: the test's scratch folder (calls.log is there).
# FAKE_FAIL=key,key...: the steps that fail (keys below: train_eager, train_sink, bench_fp16,
# bench_bf16_sink, torch_eager_bf16, torch_compile_fp16, harness, harness_kernels, golden, nccl...).
log() { echo "$(basename "$0") $*" >> "$GC_FAKES/calls.log"; }
fails() { [[ ",${FAKE_FAIL:-}," == *",$1,"* ]]; }
# FAKE_HANG=key,...: the steps that hang (same keys) until the script's time limit kills them.
hang_if() { [[ ",${FAKE_HANG:-}," == *",$1,"* ]] && sleep 300; return 0; }
