#!/usr/bin/env bash
# Packs a build made here for a GPU machine that has the NVIDIA driver, the CUDA libraries
# (toolkit or PyTorch's pip wheels) and Python, but none of the Debian libraries the build
# links (oneDNN, spdlog, fmt, yaml-cpp, libjpeg-turbo, libpng, ...):
#
#   scripts/gpu-bundle.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, gpu-bundle)
#
# writes OUT_DIR/bundle.tar.xz holding bin/ (resnet, test_ops, test_model, test_dist, stripped) and
# lib/ (every shared library they load except the CUDA ones and the driver: those come
# from the GPU machine), including this machine's glibc and its loader, so the binaries run
# under a newer or older glibc alike: scripts/gpu-check.sh starts them through
# lib/ld-linux-x86-64.so.2 --library-path (never through LD_LIBRARY_PATH, so child
# processes such as python3 keep the machine's own libraries). OUT_DIR is git-ignored so
# that the device tool can carry it (its limit is 64 MiB; the archive is about 15 MiB).
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-gpu-bundle}
bins=("$build/resnet" "$build/tests/test_ops" "$build/tests/test_model" "$build/tests/test_dist")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "gpu-bundle: $b is missing; build it first: cmake --build $build -j2 --target resnet test_ops test_model test_dist" >&2; exit 1; }
done
nm -C "$build/resnet" | grep make_cuda_backend >/dev/null || { echo "gpu-bundle: $build/resnet has no CUDA backend (configure found no nvcc/cuDNN)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in "${bins[@]}"; do
  cp "$b" "$stage/bin/"
  strip --strip-unneeded "$stage/bin/$(basename "$b")"
done
# The CUDA libraries and the driver stay behind: the GPU machine has its own, matching its driver.
is_cuda_lib() { [[ $1 =~ ^lib(cuda|cudart|cublas|cublasLt|cudnn|cudnn_[a-z_]+|nccl|nvrtc|nvJitLink)\.so ]]; }
declare -A seen=()
# A library ldd cannot find here would be missing there too: stop now, not on the GPU machine.
unfound=$(for b in "${bins[@]}"; do ldd "$b"; done | awk '$2 == "=>" && $3 == "not" {print $1}' | sort -u |
  while read -r name; do is_cuda_lib "$name" || echo "$name"; done)
[[ -z $unfound ]] || { echo "gpu-bundle: libraries not found here (ldd): $unfound" >&2; exit 1; }
for b in "${bins[@]}"; do
  while read -r name path; do
    [[ -n $path && -f $path ]] || continue
    is_cuda_lib "$name" && continue
    [[ -n ${seen[$name]:-} ]] && continue
    seen[$name]=1
    cp -L "$path" "$stage/lib/$name"
  done < <(ldd "$b" | awk '/=>/ {print $1, $3} !/=>/ && /ld-linux/ {n=$1; sub(".*/", "", n); print n, $1}')
done
for f in "$stage"/lib/*; do strip --strip-unneeded "$f" 2>/dev/null || true; done
{
  echo "built $(date -u +%FT%TZ) on $(hostname) from $(git rev-parse HEAD)$(git diff --quiet || echo ' (with uncommitted changes)')"
  echo "glibc $(ldd --version | head -1)"
  echo "needs on the GPU machine: $(for b in "${bins[@]}"; do ldd "$b"; done | awk '{print $1}' | grep -E '^lib(cuda|cudart|cublas|cublasLt|cudnn|nccl)' | sort -u | tr '\n' ' ')"
  (cd "$stage" && find bin lib -type f -printf '%s %p\n' | sort -k2)
} > "$stage/MANIFEST"
mkdir -p "$out"
tar -C "$stage" -cJf "$out/bundle.tar.xz.tmp" bin lib MANIFEST
mv "$out/bundle.tar.xz.tmp" "$out/bundle.tar.xz"
cp "$stage/MANIFEST" "$out/MANIFEST"
echo "gpu-bundle: $out/bundle.tar.xz ($(du -h "$out/bundle.tar.xz" | cut -f1)); carry '$out' to the GPU machine"
