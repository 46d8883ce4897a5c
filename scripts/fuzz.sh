#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang and runs each for SECONDS (default 30),
# starting from its seeds: valid images for decode_fuzz (tools/make_test_images.py, when PIL
# is there), fuzz/seeds-<target>/ (valid files and regress-* inputs of past crashes), and what
# earlier runs found (build-fuzz/corpus-*). A crash fails the script and leaves the
# input in build-fuzz/ (crash-*), to be turned into a test.
# Usage: scripts/fuzz.sh [SECONDS=30]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
build=build-fuzz
CC=clang CXX=clang++ cmake -S fuzz -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
seeds="$build/seeds"
if [ ! -d "$seeds" ]; then
  mkdir -p "$seeds"
  if /usr/bin/python3 tools/make_test_images.py "$build/images" >/dev/null 2>&1; then
    cp "$build"/images/*.jpg "$build"/images/*.png "$build"/images/*.JPEG "$seeds"/
  fi
fi
status=0
for target in "$build"/*_fuzz; do
  [ -f "$target" ] && [ -x "$target" ] || continue  # not the corpus-*_fuzz folders
  name=$(basename "$target")
  corpus="$build/corpus-$name"
  mkdir -p "$corpus"
  extra=()
  [ "$name" = decode_fuzz ] && extra=("$seeds")
  [ -d "fuzz/seeds-$name" ] && extra+=("fuzz/seeds-$name")
  echo "fuzz: $name for ${seconds}s" >&2
  if ! (cd "$build" && "./$name" -max_total_time="$seconds" -max_len=262144 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=0 "corpus-$name" "${extra[@]/#/../}" >"$name.log" 2>&1); then
    echo "fuzz: $name FAILED; see $build/$name.log" >&2
    tail -40 "$build/$name.log" >&2
    status=1
  else
    grep -E "^Done|#[0-9]+.*DONE" "$build/$name.log" | tail -1 >&2 || true
  fi
done
exit $status
