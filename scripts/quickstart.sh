#!/usr/bin/env bash
# Installs what is missing, builds resnet.cpp and runs the default training:
# resnet20 on Fashion-MNIST on the best available device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
exec ./build/resnet train "$@"
