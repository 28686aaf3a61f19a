#!/usr/bin/env bash
# The mutation fuzzer for the parsers of files relay does not write
# (tokenizer.json, tokenizer_config.json, safetensors files and indexes, YAML
# configs, config.json): builds tests/fuzz's relay_fuzz_inputs and runs it for
# longer than ctest's 18 s. Exits non-zero when anything crashed.
#
#   scripts/fuzz.sh [SECONDS] [TARGET] [--runs N] [--seed N] [other flags]
#   scripts/fuzz.sh --libfuzzer [SECONDS] [TARGET]
#
#   SECONDS      total time, split evenly between the targets (default 300)
#   TARGET       all (default), tokenizer, tokenizer_config, safetensors,
#                shard_index, config_yaml or hf_config
#   --runs N     stop each target after N inputs instead (the time still caps it)
#   --seed N     another seed gives other inputs (default 1)
#   --libfuzzer  coverage-guided instead: builds relay with clang, libFuzzer
#                and ASan in build-libfuzzer/ (slow: every model source again)
#                and runs relay_fuzz_libfuzzer from the seeds
#   BUILD_DIR    build directory (default build); CRASH_DIR where crashing
#                inputs go (default fuzz-crashes/, replay each with the command
#                the report prints)
#
# docs/fuzzing.md says what the targets do and how to read a report.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=300
target=all
libfuzzer=0
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --libfuzzer) libfuzzer=1 ;;
    --runs|--seed|--batch|--timeout|--memory-mb|--corpus) pass+=("$1" "$2"); shift ;;
    [0-9]*) seconds=$1 ;;
    -*) echo "fuzz.sh: unknown flag $1" >&2; exit 2 ;;
    *) target=$1 ;;
  esac
  shift
done
crash_dir=${CRASH_DIR:-fuzz-crashes}

if [ "$libfuzzer" = 0 ]; then
  build_dir=${BUILD_DIR:-build}
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRELAY_WERROR=ON >/dev/null
  cmake --build "$build_dir" --target relay_fuzz_inputs
  exec "$build_dir/tests/fuzz/relay_fuzz_inputs" --target "$target" --seconds "$seconds" \
    --crash-dir "$crash_dir" "${pass[@]}"
fi

build_dir=${BUILD_DIR:-build-libfuzzer}
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRELAY_LIBFUZZER=ON -DRELAY_BUILD_BENCH=OFF >/dev/null
cmake --build "$build_dir" --target relay_fuzz_libfuzzer
targets=(tokenizer tokenizer_config safetensors shard_index config_yaml hf_config)
[ "$target" = all ] || targets=("$target")
per_target=$(( seconds / ${#targets[@]} ))
mkdir -p "$crash_dir"
# LibTorch and yaml-cpp are not instrumented: their containers look
# overflowed to ASan, and their one-time allocations look leaked.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:detect_container_overflow=0}
rc=0
for t in "${targets[@]}"; do
  # libFuzzer adds what it finds to the first directory: a copy of the seeds.
  corpus="$build_dir/corpus/$t"
  mkdir -p "$corpus"
  cp -n tests/fuzz/corpus/"$t"/* "$corpus"/
  echo "fuzz.sh: libFuzzer on $t for ${per_target} s"
  RELAY_FUZZ_TARGET=$t "$build_dir/tests/fuzz/relay_fuzz_libfuzzer" "$corpus" \
    -max_total_time="$per_target" -timeout=10 -rss_limit_mb=4096 -max_len=1048576 \
    -artifact_prefix="$crash_dir/$t-" -print_final_stats=1 || rc=1
done
exit $rc
