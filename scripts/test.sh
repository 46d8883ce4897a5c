#!/usr/bin/env bash
# Installs what is missing, builds resnet.cpp and runs the whole test suite.
# Usage: scripts/test.sh [preset]   (default: "default"; "debug-asan" for sanitizers)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
bash scripts/install-deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset"
