#!/usr/bin/env bash
# Configures and builds relay with the one configuration that scripts/run.sh
# and scripts/test.sh share, so that running one after the other compiles
# each file once (ccache keys on the flags: a second configuration rebuilds
# everything). Arguments are build targets; none = all.
#   BUILD_DIR   build directory (default: build)
#   JOBS        parallel build jobs (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRELAY_WERROR=ON >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
