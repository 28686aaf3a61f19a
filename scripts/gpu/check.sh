#!/usr/bin/env bash
# The GPU checklist (docs/gpu.md), after scripts/gpu/build.sh: each step
# timed, its output in a log of its own, and a summary of pass/fail and the
# figures. Everything is written to BUILD_DIR/gpu-check/; when the device
# tool set $OUT, it gets summary.txt and check-logs.tar.gz (every log and
# each run's metrics.jsonl): it brings back at most 8 files.
#
#   scripts/gpu/check.sh [--build-dir DIR] [--only STEPS] [--steps N]
#
#   --build-dir  the build.sh build (default build-gpu)
#   --only       comma-separated steps: smi, cuda, unit, run, sync, bench,
#                yardstick (default: all, in that order)
#   --steps      RL steps of each `relay run` (default 20)
#
# Steps:
#   smi    nvidia-smi
#   cuda   ctest -L cuda: the CUDA tests (tests/unit/cuda/cuda_test.cc)
#   unit   every unit test on the CUDA build (CPU tests too)
#   run    relay run configs/arith.yaml on the GPU: run.autocast=bfloat16,
#          then also model.dtype=bfloat16, both fetching weights over gRPC;
#          then an fp32 trainer with workers in bf16 (rollout.dtype)
#          (relay run puts every process on cuda:0)
#   sync   weight sync over NCCL (services.weight_sync=broadcast) needs the
#          worker on another GPU than the trainer: with 2 GPUs a
#          relay-trainer on cuda:0 and a relay-rollout on cuda:1; with one,
#          a broadcast run shows what relay does when NCCL refuses the
#          group (not counted)
#   bench  rollout_bench --quick on the GPU (fp32, then bf16); then
#          weight_sync_bench --quick decoding on the GPU through a version
#          fetched over gRPC, fetched on a thread against in the loop (not
#          counted)
#   yardstick  the Qwen2.5-0.5B shape (scripts/models/qwen2.5-0.5b.sh, random
#          bf16 weights) decoding in bf16 on the GPU against a plain-PyTorch
#          HF-style loop on the same weights there (bench/python/relay_ref.py,
#          sdpa attention, the machine's python3) and against the GPU's own
#          bandwidth and GEMM peak (rollout_bench --only py): batch 1, 8, 64;
#          after relay_ref.py's selfcheck; then the engine again with
#          rollout.decode_graphs off (not counted). The tokenizer: pack.sh's
#          .gpu-kit/dist/qwen2-tokenizer.json.xz, else ../shared's
# Exits 0 when every counted step passed; 1 otherwise.
set -uo pipefail
# One block, read whole before it runs: editing this file meanwhile is safe.
{
cd "$(dirname "$0")/../.." || exit 1

build_dir=build-gpu
only=smi,cuda,unit,run,sync,bench,yardstick
rl_steps=20
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift ;;
    --only) only=$2; shift ;;
    --steps) rl_steps=$2; shift ;;
    -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -f "$build_dir/gpu-env.sh" ] || { echo "check.sh: no $build_dir/gpu-env.sh: run scripts/gpu/build.sh first" >&2; exit 1; }
# shellcheck source=/dev/null
source "$build_dir/gpu-env.sh"

out=$build_dir/gpu-check
rm -rf "$out"
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
failed=0
bin=$build_dir/src
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# NCCL's own timeouts and errors as exceptions, not a process torn down
# (docs/cluster.md, GPUs).
export TORCH_NCCL_BLOCKING_WAIT=${TORCH_NCCL_BLOCKING_WAIT:-1}

note() { echo "$*" | tee -a "$summary"; }
want() { [[ ",$only," == *",$1,"* ]]; }
# run_step NAME COUNTED CMD...: runs CMD with its output in $out/NAME.log,
# timed; COUNTED=1 makes a failure fail the checklist.
run_step() {
  local name=$1 counted=$2
  shift 2
  local t0 rc
  t0=$(date +%s.%N)
  echo "== $name: $*" >&2
  "$@" >"$out/$name.log" 2>&1
  rc=$?
  local secs
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  local verdict=PASS
  if [ $rc -ne 0 ]; then
    verdict=$([ "$counted" = 1 ] && echo FAIL || echo "FAIL (not counted)")
    [ "$counted" = 1 ] && failed=$((failed + 1))
  fi
  note "$(printf '%-28s %-20s %7s s  (exit %d, log %s.log)' "$name" "$verdict" "$secs" "$rc" "$name")"
  return "$rc"
}
ctest_counts() {  # "N passed, N failed, N skipped" from a ctest log
  # "100% tests passed out of 13" (CTest 4 with no failure) or
  # "92% tests passed, 1 tests failed out of 13".
  local total failed skipped
  total=$(sed -n 's/.*tests.* out of \([0-9]*\).*/\1/p' "$1" | tail -1)
  failed=$(sed -n 's/.*, \([0-9]*\) tests failed out of.*/\1/p' "$1" | tail -1)
  skipped=$(grep -c '(Skipped)$' "$1")
  echo "$((${total:-0} - ${failed:-0} - skipped)) passed, ${failed:-0} failed, $skipped skipped"
}
finish() {
  note "result: $([ $failed -eq 0 ] && echo PASS || echo "FAIL ($failed counted steps failed)")"
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    cp "$summary" "$OUT/summary.txt"
    (cd "$out" && find . -name '*.log' -o -name metrics.jsonl -o -name config.yaml |
       tar -czf "$OUT/check-logs.tar.gz" -T -)
  fi
  echo "summary: $summary" >&2
  cat "$summary" >&2
  [ $failed -eq 0 ]
}

# A check stopped from outside (a timeout around it) still sums up what ran.
trap 'note "stopped by a signal"; failed=$((failed + 1)); finish; exit 1' TERM INT
note "relay GPU checklist, $(date -u '+%Y-%m-%d %H:%M UTC'), build $build_dir$([ "$RELAY_GPU_SIMULATED" = 1 ] && echo ' (SIMULATED: CPU LibTorch)')"
gpus=0
dev=cuda
[ "$RELAY_GPU_SIMULATED" = 1 ] && dev=cpu  # the script's own logic, on the CPU
if command -v nvidia-smi >/dev/null; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi

# ---- nvidia-smi ----
if want smi; then
  if command -v nvidia-smi >/dev/null; then
    run_step nvidia-smi 1 nvidia-smi
    note "  $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | paste -sd';')"
  else
    note "nvidia-smi                   SKIP                  (not on this machine)"
  fi
fi
note "GPUs visible: $gpus"

# ---- the CUDA tests ----
if want cuda; then
  # -V: every test's output, for the figures the tests print (grepped below).
  run_step ctest-cuda 1 ctest --test-dir "$build_dir" -L cuda -V --timeout 300
  note "  $(ctest_counts "$out/ctest-cuda.log")"
  grep -E 'decode vs score|GPU vs CPU|on-policy step|autocast|one GPU:|two GPUs' "$out/ctest-cuda.log" |
    sed 's/^/  /' | sort -u | tee -a "$summary" >/dev/null
fi

# ---- the whole unit suite ----
if want unit; then
  run_step ctest-unit 1 ctest --test-dir "$build_dir" -E '_NOT_BUILT$' -LE 'integration|fuzz' -j "$(( $(nproc --all) > 8 ? 8 : $(nproc --all) ))" \
    --output-on-failure --timeout 300
  note "  $(ctest_counts "$out/ctest-unit.log")"
  grep -A30 'The following tests FAILED' "$out/ctest-unit.log" | sed 's/^/  /' >>"$summary"
fi

# ---- relay run on the GPU ----
# relay_run NAME COUNTED OVERRIDES...: one run in $out/runs/NAME.
relay_run() {
  local name=$1 counted=$2
  shift 2
  run_step "run-$name" "$counted" timeout 300 "$bin/relay" run configs/arith.yaml \
    experiment.name="$name" experiment.output_dir="$out/runs" experiment.steps="$rl_steps" \
    run.device="$dev" "$@"
  local rc=$?
  run_figures "$out/run-$name.log"
  return "$rc"
}
run_figures() {
  local acc last
  acc=$(sed -n 's/.*eval after: accuracy \([0-9.]*\).*/\1/p' "$1" | tail -1)
  last=$(grep -E '^step [0-9]+/' "$1" | tail -1)
  note "  ${last:-no step line}; held-out accuracy ${acc:-?}"
  # Each worker's last line: versions applied, how many by broadcast.
  grep -h 'versions applied' "$@" | sed 's/^/  /' | tee -a "$summary" >/dev/null
}
# A relay-trainer on $1 and one relay-rollout on $2 with NCCL (Gloo on the
# CPU) weight sync, started by hand as on a cluster (docs/cluster.md).
# shellcheck disable=SC2317 # called through run_step
pair_run() {
  local trainer_dev=$1 worker_dev=$2 dir=$out/runs/pair
  local common=(configs/arith.yaml experiment.steps="$rl_steps" run.autocast=bfloat16
                services.weight_sync=broadcast rollout.workers=1)
  [ "$dev" = cpu ] && common=(configs/arith.yaml experiment.steps="$rl_steps" services.weight_sync=broadcast rollout.workers=1)
  "$bin/relay-trainer" "${common[@]}" --run-dir "$dir" services.listen=127.0.0.1:0 \
    run.device="$trainer_dev" >"$out/pair-trainer.log" 2>&1 &
  local trainer=$! port=""
  for _ in $(seq 1 600); do
    port=$(sed -n 's/^serving on port \([0-9]*\).*/\1/p' "$out/pair-trainer.log")
    [ -n "$port" ] && break
    kill -0 "$trainer" 2>/dev/null || break
    sleep 0.5
  done
  if [ -z "$port" ]; then
    kill "$trainer" 2>/dev/null
    echo "the trainer did not start serving" >&2
    return 1
  fi
  timeout 300 "$bin/relay-rollout" "${common[@]}" --trainer "127.0.0.1:$port" --name worker-1 \
    run.device="$worker_dev" >"$out/pair-worker.log" 2>&1 &
  local worker=$!
  local rc=0
  wait "$trainer" || rc=$?
  wait "$worker" || rc=$?
  cat "$out/pair-trainer.log" "$out/pair-worker.log"
  return "$rc"
}
if want run; then
  note "weight sync: NCCL (services.weight_sync=broadcast) needs the worker on another GPU than"
  note "  the trainer (NCCL refuses two ranks on one device), and relay run puts every process"
  note "  on cuda:0 (workers have no LOCAL_RANK): its runs fetch over gRPC (docs/gpu.md)"
  relay_run autocast-bf16 1 run.autocast=bfloat16
  relay_run bf16-weights 1 run.autocast=bfloat16 model.dtype=bfloat16
  # The usual RL split: an fp32 trainer, workers decoding a bf16 copy.
  relay_run bf16-rollout 1 rollout.dtype=bfloat16
fi
if want sync; then
  if [ "$gpus" -ge 2 ] || [ "$dev" = cpu ]; then
    t0=cuda:0 t1=cuda:1
    [ "$dev" = cpu ] && t0=cpu t1=cpu
    run_step run-nccl-pair 1 pair_run "$t0" "$t1"
    run_figures "$out/pair-trainer.log" "$out/pair-worker.log"
  fi
  if [ "$gpus" -lt 2 ]; then
    # Broadcast with every process on one GPU: NCCL refuses the group; the
    # workers should fall back to fetching, the run should finish.
    relay_run broadcast-one-gpu 0 run.autocast=bfloat16 services.weight_sync=broadcast
  fi
fi

# ---- the decode benchmark ----
if want bench; then
  models=tiny,qwen2-100m
  [ "$dev" = cpu ] && models=tiny  # the simulation checks the step, not the figures
  for dtype in float32 bfloat16; do
    run_step "rollout-bench-$dtype" 1 timeout 420 "$build_dir/bench/rollout_bench" --quick \
      --device "$dev" --dtype "$dtype" --only kv --models "$models" --batches 1,8,64
    # The engine rows of the table: model, batch, tokens/s, ratio to re-encode.
    awk -v dtype="$dtype" '$2 == "kv" && $4 == "engine" {
           printf "  %s %s B=%s: %s tokens/s (%s re-encode)\n", $1, dtype, $3, $7, $8 }' \
      "$out/rollout-bench-$dtype.log" | awk '!seen[$0]++' | tee -a "$summary" >/dev/null
  done
  # The engine with rollout.dtype bfloat16 against fp32 on the same weights.
  run_step rollout-bench-engine-dtype 0 timeout 420 "$build_dir/bench/rollout_bench" --quick \
    --device "$dev" --only dtype --models "$models" --batches 1,8,64
  awk '$2 == "dtype" && $4 == "bf16" {
         printf "  %s rollout.dtype bfloat16 B=%s: %s tokens/s (%s fp32)\n", $1, $3, $7, $8 }' \
    "$out/rollout-bench-engine-dtype.log" | awk '!seen[$0]++' | tee -a "$summary" >/dev/null
  # A worker's decoding through a fetched version (docs/BENCHMARKS.md,
  # "Decoding through a fetched version"): on a GPU the download does not
  # share the decode's cores, which is what the fetch thread is for.
  run_step weight-sync-bench-decode 0 timeout 300 "$build_dir/bench/weight_sync_bench" --quick \
    --decode-device "$dev" --decode-batch 8
  grep -E '^decoding through|^  (loop|background) ' "$out/weight-sync-bench-decode.log" |
    sed 's/^/  /' | tee -a "$summary" >/dev/null
fi

# ---- the yardstick: Qwen2.5-0.5B-shaped decode against PyTorch and the HBM ----
if want yardstick; then
  # The interpreter whose torch build.sh built against (gpu-env.sh's
  # libraries first); in the simulation, Debian's.
  python=${RELAY_PYTHON:-$([ "$dev" = cpu ] && echo /usr/bin/python3 || command -v python3)}
  run_step relay-ref-selfcheck 1 "$python" bench/python/relay_ref.py selfcheck
  sed -n 's/^selfcheck /  selfcheck /p' "$out/relay-ref-selfcheck.log" | tee -a "$summary" >/dev/null
  dir05=$out/qwen2.5-0.5b
  tokenizer=../shared/testdata/tokenizer_parity/qwen2/tokenizer.json
  if [ -f .gpu-kit/dist/qwen2-tokenizer.json.xz ]; then
    tokenizer=$out/qwen2-tokenizer.json
    xz -dc .gpu-kit/dist/qwen2-tokenizer.json.xz >"$tokenizer"
  fi
  if run_step model-05b 1 env RELAY="$bin/relay" TOKENIZER="$tokenizer" \
       bash scripts/models/qwen2.5-0.5b.sh "$dir05"; then
    # The simulation (2 CPU cores, torch 1.13: no sdpa) checks the step's
    # wiring on one short batch, not the figures.
    args=(--py-attention sdpa --batches 1,8,64 --reps 3)
    [ "$dev" = cpu ] && args=(--py-attention eager --batches 1 --reps 1 --new 8)
    run_step decode-05b-bf16 1 timeout 420 env RELAY_PYTHON="$python" \
      "$build_dir/bench/rollout_bench" --model-dir "$dir05" --only py --device "$dev" \
      --dtype bfloat16 "${args[@]}"
    # The engine against the Python loop, the roofline and its own products,
    # and the logits check's line.
    awk '$2 == "py" && $4 == "engine" {
           printf "  0.5B bf16 B=%s: engine %s tokens/s, %s the Python loop\n", $3, $7, $8 }
         $2 == "bound" && ($4 == "roofline" || $4 == "products") {
           printf "  0.5B bf16 B=%s: %s the %s bound\n", $3, $8, $4 }' \
      "$out/decode-05b-bf16.log" | awk '!seen[$0]++' | tee -a "$summary" >/dev/null
    grep -m1 -o 'python vs relay logits:.*' "$out/decode-05b-bf16.log" | sed 's/^/  /' |
      tee -a "$summary" >/dev/null
    grep -m1 '^machine' "$out/decode-05b-bf16.log" | sed 's/^/  /' | tee -a "$summary" >/dev/null
    # The same without CUDA graphs (rollout.decode_graphs: off): what the
    # graphs bought, the Python loop again as the common baseline.
    run_step decode-05b-bf16-no-graphs 0 timeout 300 env RELAY_PYTHON="$python" \
      "$build_dir/bench/rollout_bench" --model-dir "$dir05" --only py --device "$dev" \
      --dtype bfloat16 --decode-graphs off "${args[@]}"
    awk '$2 == "py" && $4 == "engine" {
           printf "  0.5B bf16 B=%s, decode_graphs off: engine %s tokens/s, %s the Python loop\n",
                  $3, $7, $8 }' \
      "$out/decode-05b-bf16-no-graphs.log" | awk '!seen[$0]++' | tee -a "$summary" >/dev/null
  fi
  rm -rf "$dir05" "$out/qwen2-tokenizer.json"
fi

finish
exit
}
