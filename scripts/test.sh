#!/usr/bin/env bash
# Set-up, configure, build and run every test. Exits non-zero on any failure.
# The build is scripts/build.sh's, the one scripts/run.sh uses too. Tests are
# labelled (ctest -L): unit, integration, e2e (learning runs), fuzz, cuda;
# `ctest --test-dir build -L unit` runs the fast ones alone.
#   BUILD_DIR   build directory (default: build)
#   JOBS        parallel build/test jobs (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
start=$(date +%s)
BUILD_DIR="$build_dir" JOBS="$jobs" ./scripts/build.sh
built=$(date +%s)
echo "test.sh: build took $((built - start)) s"

# Tests set their own thread counts where it matters; keep LibTorch from
# oversubscribing when ctest runs several test processes at once.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ctest --test-dir "$build_dir" -j "$jobs" --output-on-failure --timeout 300
echo "test.sh: ctest took $(( $(date +%s) - built )) s"
