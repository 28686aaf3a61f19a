#!/usr/bin/env bash
# What on-policy distillation's teacher costs where relay runs it, in the
# rollout worker after sampling: `relay rollout` samples a batch of groups
# and the teacher (trainer.distill.teacher) scores them in the same process,
# which reports the teacher's seconds against the engine's sampling seconds
# of that very batch. Two shapes, REPS runs each (interleaved), median and
# range of the ratio:
#   arith   the main job's tiny student (2 layers x 64) and a 4 x 128 teacher
#           (about 8x the weights), char tokenizer, 16 groups of 8 samples
#   qwen    a Qwen2.5-0.5B-shaped student scored by a Qwen2.5-0.5B-shaped
#           teacher (random weights, the real Qwen2 tokenizer; the yardstick
#           model of these machines), 4 groups of 4 samples of 64 tokens
#
#   bench/teacher_bench.sh [REPS] [SHAPES]     (default 3 "arith qwen")
#
# RELAY: the relay binary (default build/src/relay). The qwen shape builds
# runs/models/qwen2.5-0.5b with scripts/models/qwen2.5-0.5b.sh when missing.
# Needs python3 (standard library only).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
shapes=${2:-arith qwen}
relay=${RELAY:-build/src/relay}
[ -x "$relay" ] || { echo "teacher_bench: $relay not built" >&2; exit 1; }
out=$(mktemp -d /tmp/relay_teacher_bench.XXXXXX)
trap 'rm -rf "$out"' EXIT

for shape in $shapes; do
  case $shape in
    arith)
      "$relay" init configs/arith.yaml --out "$out/arith_teacher" model.init.layers=4 \
        model.init.hidden=128 model.init.ffn=256 run.seed=1 > /dev/null
      ;;
    qwen)
      [ -d runs/models/qwen2.5-0.5b ] || scripts/models/qwen2.5-0.5b.sh > /dev/null
      ;;
    *) echo "teacher_bench: unknown shape $shape" >&2; exit 1 ;;
  esac
done

for ((r = 0; r < reps; r++)); do
  for shape in $shapes; do
    case $shape in
      arith)
        args=(configs/arith.yaml --prompts 16 "trainer.distill.teacher=$out/arith_teacher"
              trainer.distill.coef=1 run.seed="$r")
        ;;
      qwen)
        args=(configs/qwen2.5-0.5b.yaml --prompts 4 rollout.max_new_tokens=64
              trainer.distill.teacher=runs/models/qwen2.5-0.5b trainer.distill.coef=1
              run.seed="$r")
        ;;
    esac
    "$relay" rollout "${args[@]}" > "$out/$shape.$r.log" 2>&1 ||
      { echo "teacher_bench: $shape failed:" >&2; tail -5 "$out/$shape.$r.log" >&2; exit 1; }
    grep -h "^teacher:" "$out/$shape.$r.log" | sed "s/^/$shape rep $r: /" >&2
  done
done

python3 - "$out" "$reps" $shapes <<'PY'
import re, statistics, sys
out, reps, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("| shape | sampled tokens/s | teacher tokens/s (prompt + response) | teacher s / sampling s |")
print("|---|---|---|---|")
for shape in shapes:
    ratios, sample_tps, teacher_tps = [], [], []
    for r in range(reps):
        text = open(f"{out}/{shape}.{r}.log").read()
        m = re.search(r"response tokens in [0-9.]+ s \(([0-9.]+) tokens/s\)", text)
        t = re.search(r"^teacher: .* tokens in [0-9.]+ s \(([0-9.]+) tokens/s\), ([0-9.]+)x", text, re.M)
        sample_tps.append(float(m.group(1)))
        teacher_tps.append(float(t.group(1)))
        ratios.append(float(t.group(2)))
    def fmt(v, p=2):
        return f"{statistics.median(v):.{p}f} ({min(v):.{p}f}-{max(v):.{p}f})"
    print(f"| {shape} | {fmt(sample_tps, 0)} | {fmt(teacher_tps, 0)} | {fmt(ratios)} |")
PY
