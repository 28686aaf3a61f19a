#!/usr/bin/env bash
# End-to-end samples/s of `relay run` at several staleness bounds on the same
# config, interleaved over repetitions so machine noise hits every setting
# alike. The figure is RL-phase throughput: trajectories trained on divided
# by the trainer's RL wall time (time/elapsed_s of its last step), so the
# warm start and process start-up are not counted.
#
#   bench/staleness_bench.sh [CONFIG] [REPS] [STALENESS...]
#   e.g. bench/staleness_bench.sh configs/arith.yaml 3 0 2 4
#
# Needs a built tree (build/src/relay) and python3 for the arithmetic.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/arith.yaml}
reps=${2:-3}
shift 2 || true
bounds=("$@")
[ ${#bounds[@]} -eq 0 ] && bounds=(0 2 4)
relay=build/src/relay
out=$(mktemp -d /tmp/relay_staleness_bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
: > "$out/results.tsv"
for rep in $(seq 1 "$reps"); do
  for s in "${bounds[@]}"; do
    dir="$out/s${s}_r${rep}"
    "$relay" run "$config" experiment.output_dir="$dir" trainer.max_staleness="$s" \
      eval.every=0 > "$dir.log" 2>&1
    python3 - "$dir" "$s" "$rep" >> "$out/results.tsv" <<'PY'
import json, os, sys
d, s, rep = sys.argv[1:]
[run] = [os.path.join(d, x) for x in os.listdir(d)]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
rl = [r for r in rows if r["phase"] == "rl"]
evals = [r["accuracy"] for r in rows if r["phase"] == "eval"]
samples = sum(r["batch/trajectories"] for r in rl)
elapsed = rl[-1]["time/elapsed_s"]
stale = sum(r["staleness/mean"] for r in rl) / len(rl)
print(f"{s}\t{rep}\t{samples / elapsed:.1f}\t{elapsed:.2f}\t{stale:.2f}\t{evals[-1]:.3f}")
PY
  done
done
python3 - "$out/results.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
by = {}
for s, rep, sps, el, st, acc in rows:
    by.setdefault(int(s), []).append((float(sps), float(el), float(st), float(acc)))
base = statistics.median(x[0] for x in by[min(by)])
print("| max_staleness | samples/s (median) | vs sync | RL wall s | mean staleness | final accuracy |")
print("|---|---|---|---|---|---|")
for s in sorted(by):
    v = by[s]
    med = statistics.median(x[0] for x in v)
    print(f"| {s} | {med:.0f} ({', '.join(f'{x[0]:.0f}' for x in v)}) | {med / base:.2f}x | "
          f"{statistics.median(x[1] for x in v):.2f} | {statistics.median(x[2] for x in v):.2f} | "
          f"{statistics.median(x[3] for x in v):.3f} |")
PY
