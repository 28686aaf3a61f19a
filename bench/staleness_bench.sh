#!/usr/bin/env bash
# End to end: `relay run` of one config at several staleness bounds, the
# bounds interleaved inside each repetition so machine noise hits them alike.
# Repetition r runs every bound with run.seed = r - 1 (paired: the same
# seeds for every bound).
#
# Two figures per run, both from the trainer's metrics.jsonl:
#   samples/s     RL-phase throughput: trajectories trained on / the RL wall
#                 time (time/elapsed_s of the last step, which starts after the
#                 warm start, so neither it nor process start-up is counted).
#                 Taken from a run with eval.every=0, so no eval pauses the
#                 trainer.
#   time-to-acc   seconds of RL wall time until held-out greedy accuracy first
#                 reaches TARGET, from a second run with eval.every=EVAL_EVERY
#                 and experiment.steps=STEPS_CAP, stopped (SIGTERM) once it
#                 has: time/elapsed_s of the step whose eval first scores
#                 >= TARGET (0 if the eval after the warm start already does).
#                 Its evals run inside the RL loop, so the time of the evals
#                 before that step is counted in it; "net" subtracts it (the
#                 trainer's time between steps: evals, checkpoints, log lines).
#                 Workers keep generating during those gaps, so "net" slightly
#                 favours runs whose workers can run further ahead.
# Ratios are against the smallest bound given (0 = synchronous), paired by
# seed: this bound's figure over the sync run's with the same seed, then the
# median over seeds (time-to-accuracy depends on the seed far more than on the
# machine). For samples/s above 1 is faster, for time-to-accuracy below 1.
#
#   bench/staleness_bench.sh [CONFIG] [REPS] [STALENESS...]
#   e.g. bench/staleness_bench.sh configs/arith.yaml 3 0 1 2 4
#
# Environment: RELAY_BIN (default build/src/relay), EVAL_EVERY (default 2; 0
# skips the time-to-accuracy runs), TARGET (default 0.9), STEPS_CAP (default
# 200), BENCH_JSON (a file to write one JSON object per bound to, for
# scripts/bench.sh).
# Needs python3 (standard library only) for the arithmetic.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/arith.yaml}
reps=${2:-3}
shift 2 || true
bounds=("$@")
[ ${#bounds[@]} -eq 0 ] && bounds=(0 1 2 4)
relay=${RELAY_BIN:-build/src/relay}
eval_every=${EVAL_EVERY:-2}
target=${TARGET:-0.9}
steps_cap=${STEPS_CAP:-200}
[ -x "$relay" ] || { echo "staleness_bench: $relay not built" >&2; exit 1; }
out=$(mktemp -d /tmp/relay_staleness_bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
: > "$out/results.jsonl"
start=$SECONDS

# run KIND BOUND REP EXTRA_OVERRIDES...
run() {
  local kind=$1 s=$2 rep=$3
  shift 3
  local dir="$out/${kind}_s${s}_r${rep}"
  "$relay" run "$config" experiment.output_dir="$dir" trainer.max_staleness="$s" \
    run.seed=$((rep - 1)) "$@" > "$dir.log" 2>&1 &
  local pid=$! status=0
  if [ "$kind" = acc ]; then
    # Stop (SIGTERM: the run drains and checkpoints) once an eval after the
    # warm start reaches the target; the figure comes from metrics.jsonl.
    while kill -0 "$pid" 2> /dev/null; do
      if cat "$dir"/*/metrics.jsonl 2> /dev/null | awk -v t="$target" '
          /"phase":"eval"/ {
            match($0, /"accuracy":[0-9.eE+-]+/); a = substr($0, RSTART + 11, RLENGTH - 11) + 0
            match($0, /"step":[0-9]+/); st = substr($0, RSTART + 7, RLENGTH - 7) + 0
            if (st == 0 && ++at0 < 2) next  # the eval before the warm start
            if (a >= t) { hit = 1; exit }
          }
          END { exit !hit }'; then
        kill -TERM "$pid" 2> /dev/null || true
        break
      fi
      sleep 0.25
    done
    wait "$pid" || true
  else
    wait "$pid" || status=$?
  fi
  if [ "$status" -ne 0 ] || ! ls "$dir"/*/metrics.jsonl > /dev/null 2>&1; then
    echo "staleness_bench: relay run failed ($kind, max_staleness $s, rep $rep):" >&2
    tail -5 "$dir.log" >&2
    exit 1
  fi
  python3 - "$dir" "$kind" "$s" "$rep" "$target" >> "$out/results.jsonl" <<'PY'
import json, os, sys
d, kind, s, rep, target = sys.argv[1:]
[run] = [os.path.join(d, x) for x in os.listdir(d)]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
rl = [r for r in rows if r["phase"] == "rl"]
evals = [r for r in rows if r["phase"] == "eval"]
# An accuracy run stopped by the eval right after the warm start has no RL
# step at all (its time to the target is 0).
out = {"kind": kind, "bound": int(s), "rep": int(rep),
       "samples": sum(r["batch/trajectories"] for r in rl),
       "rl_s": rl[-1]["time/elapsed_s"] if rl else 0.0,
       "staleness": sum(r["staleness/mean"] for r in rl) / len(rl) if rl else None,
       "final_accuracy": evals[-1]["accuracy"] if evals else None,
       "steps": len(rl)}
if kind == "acc":
    elapsed = {r["step"]: r["time/elapsed_s"] for r in rl}
    elapsed[0] = 0.0
    # Trainer time outside steps before step k: elapsed(k) - sum of step times.
    inside, outside = 0.0, {0: 0.0}
    for r in rl:
        inside += r["time/step_s"]
        outside[r["step"]] = r["time/elapsed_s"] - inside
    # The evals at step 0 are "before" and "after warm start": only the last
    # step-0 row describes the policy RL starts from.
    last_at = {}
    for i, r in enumerate(evals):
        last_at[r["step"]] = i
    hit = None
    for i, r in enumerate(evals):
        if r["step"] == 0 and last_at[0] != i:
            continue
        if r["accuracy"] >= float(target):
            hit = r["step"]
            break
    out["start_accuracy"] = evals[last_at[0]]["accuracy"] if 0 in last_at else None
    out["hit_step"] = hit
    out["tta_s"] = elapsed[hit] if hit is not None else None
    out["tta_net_s"] = elapsed[hit] - outside[hit] if hit is not None else None
print(json.dumps(out))
PY
}

for rep in $(seq 1 "$reps"); do
  for s in "${bounds[@]}"; do
    run tput "$s" "$rep" eval.every=0
    if [ "$eval_every" -gt 0 ]; then
      run acc "$s" "$rep" eval.every="$eval_every" experiment.steps="$steps_cap"
    fi
    echo "staleness_bench: rep $rep/$reps, max_staleness $s done ($((SECONDS - start)) s)" >&2
  done
done

python3 - "$out/results.jsonl" "$target" "$eval_every" "${BENCH_JSON:-}" <<'PY'
import json, statistics, sys
path, target, eval_every, json_out = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
def fmt(x, spec):
    return "-" if x is None else format(x, spec)
def ratio(x, b):
    return None if x is None or b is None or b == 0 else x / b
# by[kind][bound][rep] = row
by = {"tput": {}, "acc": {}}
for r in rows:
    by[r["kind"]].setdefault(r["bound"], {})[r["rep"]] = r
tput, acc = by["tput"], by["acc"]
bounds = sorted(tput)
sync = bounds[0]
sps = lambda r: r["samples"] / r["rl_s"]
print(f"| max_staleness | samples/s: median (per seed) | vs sync | RL wall s | mean staleness "
      f"| final accuracy | s to {target}: median (per seed) | step reached | vs sync "
      f"| net of evals s | vs sync |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
out = []
for s in bounds:
    reps = sorted(tput[s])
    v = [tput[s][k] for k in reps]
    a = [acc.get(s, {}).get(k) for k in reps]
    # Ratios are paired by seed (repetition), then the median is taken.
    sps_ratio = med([ratio(sps(tput[s][k]), sps(tput[sync][k])) for k in reps
                     if k in tput[sync]])
    def paired(key):
        return med([ratio(acc[s][k][key], acc[sync][k][key]) for k in reps
                    if k in acc.get(s, {}) and k in acc.get(sync, {})])
    row = {"bench": "e2e", "bound": s, "runs": len(v),
           "samples_per_s": med([sps(r) for r in v]), "samples_vs_sync": sps_ratio,
           "rl_s": med([r["rl_s"] for r in v]), "staleness": med([r["staleness"] for r in v]),
           "final_accuracy": med([r["final_accuracy"] for r in v]),
           "tta_s": med([r and r["tta_s"] for r in a]), "tta_vs_sync": paired("tta_s"),
           "tta_net_s": med([r and r["tta_net_s"] for r in a]),
           "tta_net_vs_sync": paired("tta_net_s"),
           "hit_step": med([r and r["hit_step"] for r in a]),
           "missed": sum(1 for r in a if r is not None and r["tta_s"] is None),
           "target": float(target), "eval_every": int(eval_every),
           "start_accuracy": med([r and r.get("start_accuracy") for r in a])}
    out.append(row)
    per = lambda xs, spec: " / ".join(fmt(x, spec) for x in xs)
    print(f"| {s} | {fmt(row['samples_per_s'], '.0f')} ({per([sps(r) for r in v], '.0f')}) | "
          f"{fmt(sps_ratio, '.2f')}x | {row['rl_s']:.2f} | {row['staleness']:.2f} | "
          f"{row['final_accuracy']:.3f} | {fmt(row['tta_s'], '.2f')} "
          f"({per([r and r['tta_s'] for r in a], '.2f')}) | "
          f"{per([r and r['hit_step'] for r in a], '.0f')} | {fmt(row['tta_vs_sync'], '.2f')}x | "
          f"{fmt(row['tta_net_s'], '.2f')} | {fmt(row['tta_net_vs_sync'], '.2f')}x |")
if any(r["missed"] for r in out):
    print(f"(runs that never reached {target} are left out of the time medians: "
          + ", ".join(f"max_staleness {r['bound']}: {r['missed']}" for r in out if r["missed"])
          + ")")
if out and out[0]["start_accuracy"] is not None:
    print(f"accuracy after the warm start (median): {out[0]['start_accuracy']:.3f}")
if json_out:
    with open(json_out, "w") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")
PY
echo "staleness_bench: $((SECONDS - start)) s" >&2
