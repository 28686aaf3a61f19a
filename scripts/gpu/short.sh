#!/usr/bin/env bash
# The GPU checklist in one device call, for a session with little device
# time (docs/gpu.md, "A short session"): builds only what the checks run
# (the binaries, the CUDA tests, rollout_bench, weight_sync_bench), then the
# checks in order of what they prove, each phase under its own timeout,
# until SECONDS run out.
# Runs THERE, from the repository root, with .gpu-kit/dist carried.
#
#   scripts/gpu/short.sh [SECONDS] [PHASES]
#
#   SECONDS  wall-clock budget of the whole call (default 540: a device
#            call's 600 s less the transfers)
#   PHASES   space-separated check.sh --only lists, in order
#            (default "smi,cuda run sync bench yardstick")
#
# $OUT gets build.log, summary.txt (every phase's summary, in order) and a
# check-logs-PHASE.tar.gz per phase: 2 + 4 of the 8 files a call returns.
# RL runs take RELAY_GPU_RL_STEPS steps (default 10).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
deadline=$(($(date +%s) + ${1:-540}))
phases=${2:-smi,cuda run sync bench yardstick}
left() { echo $((deadline - $(date +%s))); }
out=${OUT:-/tmp/relay-gpu-out}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"

# RELAY_GPU_TARGETS=all: build.sh's default set (the unit test programs too).
targets=${RELAY_GPU_TARGETS:-relay relay-trainer relay-rollout relay_cuda_tests rollout_bench weight_sync_bench}
[ "$targets" = all ] && targets=""
export RELAY_GPU_TARGETS=$targets
timeout "$(left)" bash scripts/gpu/build.sh
rc=$?
cp build-gpu/build.log "$out/build.log" 2>/dev/null
if [ $rc -ne 0 ]; then
  echo "short.sh: the build stopped (exit $rc, $(left) s left); its last lines:" | tee -a "$summary"
  grep -E '^\[[0-9]+/[0-9]+\]|error|Error' build-gpu/build.log 2>/dev/null | tail -20 | tee -a "$summary"
  exit 1
fi

status=0
for phase in $phases; do
  budget=$(left)
  if [ "$budget" -lt 30 ]; then
    echo "short.sh: no time left for $phase" | tee -a "$summary"
    status=1
    continue
  fi
  echo "== phase $phase ($budget s left)" | tee -a "$summary"
  # check.sh writes summary.txt and check-logs.tar.gz under its $OUT.
  phase_out=$(mktemp -d)
  OUT=$phase_out timeout "$budget" bash scripts/gpu/check.sh --only "$phase" \
    --steps "${RELAY_GPU_RL_STEPS:-10}" || status=1
  if [ -f "$phase_out/check-logs.tar.gz" ]; then
    mv "$phase_out/check-logs.tar.gz" "$out/check-logs-${phase//,/-}.tar.gz"
  fi
  cat "$phase_out/summary.txt" >>"$summary" 2>/dev/null ||
    echo "short.sh: $phase left no summary" >>"$summary"
  rm -rf "$phase_out"
done
exit $status
