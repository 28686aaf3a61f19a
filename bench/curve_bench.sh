#!/usr/bin/env bash
# Learning curves of several configs on the same seeds: `relay run` of each
# config with run.seed = 0..SEEDS-1 (interleaved: seed s runs every config
# before seed s + 1), held-out greedy accuracy every EVAL_EVERY RL steps, and
# a markdown table of the accuracy at each evaluated step, median over seeds
# with the min-max spread. Used for docs/algorithms.md's curves (PPO with a
# critic against GRPO, distillation against RL).
#
#   bench/curve_bench.sh SEEDS CONFIG... [-- OVERRIDE...]
#   e.g. bench/curve_bench.sh 3 configs/arith.yaml configs/arith_ppo.yaml
#
# Environment: RELAY_BIN (default build/src/relay), EVAL_EVERY (default 10).
# Needs python3 (standard library only).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:?usage: bench/curve_bench.sh SEEDS CONFIG... [-- OVERRIDE...]}
shift
configs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do configs+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
overrides=("$@")
relay=${RELAY_BIN:-build/src/relay}
eval_every=${EVAL_EVERY:-10}
[ -x "$relay" ] || { echo "curve_bench: $relay not built" >&2; exit 1; }
out=$(mktemp -d /tmp/relay_curve_bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
for ((s = 0; s < seeds; s++)); do
  for c in "${configs[@]}"; do
    dir="$out/$(basename "$c" .yaml)_s$s"
    start=$SECONDS
    "$relay" run "$c" experiment.output_dir="$dir" run.seed="$s" eval.every="$eval_every" \
      "${overrides[@]}" > "$dir.log" 2>&1 || { echo "curve_bench: $c seed $s failed:" >&2; tail -5 "$dir.log" >&2; exit 1; }
    echo "$(basename "$c") seed $s: $((SECONDS - start)) s" >&2
  done
done
python3 - "$out" "$seeds" "${configs[@]}" <<'PY'
import json, os, statistics, sys, glob
out, seeds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
curves = {}
for c in configs:
    name = os.path.basename(c)[:-5]
    per_step = {}
    for s in range(seeds):
        files = glob.glob(os.path.join(out, f"{name}_s{s}", "*", "metrics.jsonl"))
        seen_zero = 0
        for line in open(files[0]):
            j = json.loads(line)
            if j.get("phase") != "eval":
                continue
            step = j["step"]
            if step == 0:
                seen_zero += 1
                if seen_zero == 1:
                    step = "before warm start"
            per_step.setdefault(step, []).append(j["accuracy"])
    curves[name] = per_step
steps = []
for per in curves.values():
    for k in per:
        if k not in steps:
            steps.append(k)
print("| step | " + " | ".join(curves) + " |")
print("|---|" + "---|" * len(curves))
for k in steps:
    cells = []
    for per in curves.values():
        v = per.get(k)
        cells.append("-" if not v else f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
    print(f"| {k} | " + " | ".join(cells) + " |")
PY
