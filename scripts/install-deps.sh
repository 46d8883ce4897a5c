#!/usr/bin/env bash
# Installs every Debian package resnet.cpp needs to build, test and benchmark.
# Idempotent: prints nothing and touches nothing when all are present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev                       # oneDNN 2.6: the CPU backend
  ocl-icd-opencl-dev                # only recommended by libdnnl-dev, but its CMake config requires OpenCL
  libspdlog-dev libfmt-dev          # logging
  nlohmann-json3-dev                # safetensors headers, metrics, reports
  libyaml-cpp-dev libcli11-dev      # configs and the command line
  zlib1g-dev                        # IDX .gz files
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev  # image decode
  libgtest-dev libgmock-dev libbenchmark-dev       # tests and micro-benchmarks
  clang libclang-rt-14-dev          # libFuzzer targets (scripts/fuzz.sh)
  libopenmpi-dev openmpi-bin        # data-parallel training across processes (src/dist)
  iproute2                          # ip netns: the two-host distributed test
  dataset-fashion-mnist             # the default training data
  python3-torch python3-torchvision # golden data and PyTorch comparisons (/usr/bin/python3)
  libzip-dev                        # the zip container of PyTorch .pth files (resnet import, model.pretrained)
  libonnx-dev libprotobuf-dev       # ONNX export (resnet export --out X.onnx), checked by ONNX's own checker
  python3-onnx                      # tools/onnx_check.py: the exported graph evaluated against our logits
  xz-utils                          # the GPU bundle (scripts/gpu-bundle.sh) and its dry-run test
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
