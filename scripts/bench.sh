#!/usr/bin/env bash
# relay's benchmark suite in one command: builds the benchmark programs in
# their own build directory (Release, so build/ is left alone), runs each in
# turn with machine-readable output, and prints one markdown summary of the
# headline figures, each a median of several runs with the ratio against a
# baseline measured in the same run, plus the machine it ran on.
#
#   scripts/bench.sh [--quick] [--build-dir DIR] [--no-build] [--keep DIR]
#
#   --quick      a fast pass (fewer repetitions and configurations; about 3
#                minutes of benchmarking on 2 cores); default: the full suite
#                (about 15-20 minutes)
#   --build-dir  where to build (default build-bench)
#   --no-build   use the programs already built there
#   --keep DIR   keep every program's raw output (JSON lines and logs) in DIR
#
# What each row means: docs/BENCHMARKS.md, "The suite: scripts/bench.sh".
# The Python comparisons (rollout_bench --only py, trainer_bench) are
# run when the build has them and skipped with a note when it does not.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
build_dir=build-bench
build=1
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --build-dir) build_dir=$2; shift ;;
    --no-build) build=0 ;;
    --keep) keep=$2; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if [ -n "$keep" ]; then
  mkdir -p "$keep"
  out=$(cd "$keep" && pwd)
else
  out=$(mktemp -d /tmp/relay_bench.XXXXXX)
  trap 'rm -rf "$out"' EXIT
fi
bin="$build_dir/bench"

# ---- build ----
if [ "$build" = 1 ]; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd .. && pwd)}
  echo "bench.sh: building in $build_dir (Release)" >&2
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRELAY_WERROR=ON \
    > "$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log" >&2; exit 1; }
  targets=(relay relay-trainer relay-rollout rollout_bench store_bench ingest_bench
           weight_sync_bench version_switch_bench sharding_bench packing_bench lora_bench)
  # Added on another branch: built when this tree has the target.
  if ninja -C "$build_dir" -t targets all 2>/dev/null | grep -q '^trainer_bench:'; then
    targets+=(trainer_bench)
  fi
  ninja -C "$build_dir" -j"$(nproc)" "${targets[@]}" > "$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log" >&2; exit 1; }
fi
for p in rollout_bench store_bench ingest_bench weight_sync_bench version_switch_bench \
  sharding_bench packing_bench lora_bench; do
  [ -x "$bin/$p" ] || { echo "bench.sh: $bin/$p is not built" >&2; exit 1; }
done

# ---- the machine ----
python3 - "$out/machine.json" "$bin/rollout_bench" <<'PY'
import json, os, re, subprocess, sys
path, probe = sys.argv[1:]
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
m = {}
m["cpu"] = sh("lscpu | sed -n 's/^Model name: *//p' | head -1") or "unknown"
m["cores"] = os.cpu_count()
m["threads_per_core"] = sh("lscpu | sed -n 's/^Thread(s) per core: *//p' | head -1")
mem = sh("sed -n 's/^MemTotal: *\\([0-9]*\\) kB/\\1/p' /proc/meminfo")
m["memory_gib"] = round(int(mem) / 2**20, 1) if mem else None
m["torch"] = sh("dpkg-query -W -f '${Version}' libtorch-dev 2>/dev/null") or "unknown"
hdr = "/usr/include/torch/csrc/api/include/torch/version.h"
if os.path.exists(hdr):
    parts = re.findall(r"TORCH_VERSION_(?:MAJOR|MINOR|PATCH) (\d+)", open(hdr).read())
    if len(parts) == 3:
        m["torch"] += f" (headers {'.'.join(parts)})"
blas = sh(f"ldd {probe} | sed -n 's/.*libblas.so.3 => \\([^ ]*\\).*/\\1/p'")
m["blas"] = os.path.realpath(blas) if blas else "not linked"
pkg = sh(f"dpkg -S {m['blas']} 2>/dev/null | cut -d: -f1") if blas else ""
if pkg:
    version = sh("dpkg-query -W -f '${Version}' " + pkg)
    m["blas"] += f" ({pkg} {version})"
# The kernels OpenBLAS runs in relay's processes (model/blas_kernels.h).
relay_bin = os.path.join(os.path.dirname(os.path.dirname(probe)), "src", "relay")
if os.access(relay_bin, os.X_OK):
    m["blas_kernels"] = sh(f"{relay_bin} env | sed -n 's/^blas: //p'")
m["os"] = sh(". /etc/os-release && echo $PRETTY_NAME")
m["compiler"] = sh("c++ --version | head -1")
m["load_before"] = open("/proc/loadavg").read().split()[:3]
json.dump(m, open(path, "w"))
PY

# ---- the benchmarks ----
: > "$out/ran.txt"
suite_start=$SECONDS
# step NAME COMMAND...: stdout -> NAME.out (JSON), stderr -> NAME.log
step() {
  local name=$1
  shift
  local t=$SECONDS
  echo "bench.sh: $name: $*" >&2
  if "$@" > "$out/$name.out" 2> "$out/$name.log"; then
    echo "$name $((SECONDS - t)) ok" >> "$out/ran.txt"
  else
    echo "$name $((SECONDS - t)) failed" >> "$out/ran.txt"
    echo "bench.sh: $name failed; the end of its log:" >&2
    tail -5 "$out/$name.log" >&2
  fi
  echo "bench.sh: $name: $((SECONDS - t)) s" >&2
}
skip() {
  echo "$1 0 skipped: $2" >> "$out/ran.txt"
  echo "bench.sh: $1 skipped: $2" >&2
}
# Whether a program understands a flag, read from its binary without running
# it (a bench built before 2026-11-29 ignored flags it did not know, and
# would run the whole benchmark on --help; newer ones refuse them).
knows() { grep -qa -- "$2" "$1"; }

if [ "$quick" = 1 ]; then
  q=(--quick)
  decode_args=(--models tiny,qwen2-100m --batches 8 --reps 1 --only kv)
  attention_args=(--models qwen2-100m --batches 8 --reps 1 --prompt 256 --new 8)
  sampler_args=(--batches 8,64 --reps 1)
  dtype_args=(--models qwen2-100m --batches 1,8 --reps 1)
  e2e=(1 0 2)  # repetitions, then staleness bounds
  sharding_args=(--models qwen2-100m --worlds 1,2 --reps 1)
  packing_args=(--model tiny --rows 16 --reps 3)
  lora_args=(--models tiny,qwen2-100m --reps 1)
else
  q=()
  decode_args=(--batches 8,64)  # batch 1 is rollout_bench's slowest and least telling row
  # Decode steps at a 1K context: attention over the paged cache in place vs gathered.
  attention_args=(--models qwen2-100m --batches 8,32 --reps 3 --prompt 1024 --new 16)
  # One sample() call on random logits, batched ops vs the fused CPU path.
  sampler_args=(--batches 1,8,64 --reps 5)
  # The engine with rollout.dtype bfloat16 against fp32, same weights.
  dtype_args=(--models qwen2-100m --batches 1,8,64 --reps 3)
  e2e=(5 0 1 2 4)
  sharding_args=(--models qwen2-100m --worlds 1,2,4 --reps 3)
  packing_args=(--model qwen2-100m --rows 16 --reps 3)
  lora_args=(--models qwen2-100m,qwen2.5-0.5b --reps 3)
fi

step store "$bin/store_bench" "${q[@]}" --json
step ingest env OMP_NUM_THREADS=1 "$bin/ingest_bench" "${q[@]}" --json
step weight_sync env OMP_NUM_THREADS=1 "$bin/weight_sync_bench" "${q[@]}" --json
step version_switch "$bin/version_switch_bench" "${q[@]}" --json
step decode "$bin/rollout_bench" "${decode_args[@]}" --json
if knows "$bin/rollout_bench" "in-place"; then
  step decode_attention "$bin/rollout_bench" --only attn "${attention_args[@]}" --json
else
  skip decode_attention "$bin/rollout_bench has no --only attn in this build"
fi
if knows "$bin/rollout_bench" "vocab-"; then
  step sampler "$bin/rollout_bench" --only sampler "${sampler_args[@]}" --json
else
  skip sampler "$bin/rollout_bench has no --only sampler in this build"
fi
if knows "$bin/rollout_bench" "same tokens as fp32"; then
  step decode_dtype "$bin/rollout_bench" --only dtype "${dtype_args[@]}" --json
else
  skip decode_dtype "$bin/rollout_bench has no --only dtype in this build"
fi
step sharding "$bin/sharding_bench" "${sharding_args[@]}" --json
step packing "$bin/packing_bench" "${packing_args[@]}" --json
step lora "$bin/lora_bench" "${lora_args[@]}" --json

# Decode and a trainer step against plain-PyTorch baselines on the same
# weights (Debian's python3-torch; $RELAY_PYTHON picks another interpreter).
# Installed here when missing and apt can; otherwise both steps are skipped.
python=${RELAY_PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch' 2>/dev/null && [ -z "${RELAY_PYTHON:-}" ] &&
  [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
  echo "bench.sh: installing python3-torch for the Python baselines" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch > /dev/null || true
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  skip decode_python "$python cannot import torch (install python3-torch or set RELAY_PYTHON)"
  skip trainer "$python cannot import torch (install python3-torch or set RELAY_PYTHON)"
elif knows "$bin/rollout_bench" --python; then
  # --only py: the Python rows alone (the decode step above ran kv and mixed).
  args=(--only py --json)
  [ "$quick" = 1 ] && args+=(--quick)
  step decode_python "$bin/rollout_bench" "${args[@]}"
  # The realistic yardstick: a Qwen2.5-0.5B-shaped directory (random bf16
  # weights, the real tokenizer), decoded by both loops; removed after (1 GB).
  if [ "$quick" = 0 ] && knows "$bin/rollout_bench" --model-dir; then
    dir05="$out/qwen2.5-0.5b"
    if RELAY="$build_dir/src/relay" scripts/models/qwen2.5-0.5b.sh "$dir05" \
        > "$out/model_05b.log" 2>&1; then
      step decode_05b "$bin/rollout_bench" --model-dir "$dir05" --only py --batches 1,8 \
        --reps 3 --json
    else
      skip decode_05b "scripts/models/qwen2.5-0.5b.sh failed: $(tail -1 "$out/model_05b.log")"
    fi
    rm -rf "$dir05"
  fi
else
  skip decode_python "$bin/rollout_bench has no --python mode in this build"
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  :  # skipped above
elif [ -x "$bin/trainer_bench" ]; then
  args=()
  knows "$bin/trainer_bench" --json && args+=(--json)
  [ "$quick" = 1 ] && knows "$bin/trainer_bench" --quick && args+=(--quick)
  step trainer "$bin/trainer_bench" "${args[@]}"
  # The realistic yardstick: a Qwen2.5-0.5B-shaped step (4 x 128), without
  # the core loop's third copy of the model and optimizer (24 GB machines).
  if [ "$quick" = 0 ] && knows "$bin/trainer_bench" --no-core; then
    step trainer_05b "$bin/trainer_bench" --models qwen2.5-0.5b --no-core --json
  fi
else
  skip trainer "$bin/trainer_bench is not in this build"
fi

# Its stdout is a markdown table; the rows for the summary go to e2e.json.
step e2e env RELAY_BIN="$build_dir/src/relay" BENCH_JSON="$out/e2e.json" \
  bench/staleness_bench.sh configs/arith.yaml "${e2e[@]}"
echo "bench.sh: benchmarks took $((SECONDS - suite_start)) s" >&2

# ---- the summary ----
python3 bench/summarize.py "$out" "$quick" "$((SECONDS - suite_start))"
[ -n "$keep" ] && echo "raw output: $out" >&2
exit 0
