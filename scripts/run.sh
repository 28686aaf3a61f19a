#!/usr/bin/env bash
# Set-up, build, then a tour ending in the main job: write a fresh tiny model
# in Hugging Face layout from configs/tiny.yaml, sample from it with the KV
# cache and score the sample (the recorded log-probs equal the scoring
# path's), run the rollout engine on a few arithmetic prompts, train in one
# process (relay train-local), then `relay run configs/arith.yaml`: trainer
# and rollout workers as separate processes over gRPC, the rollout store and
# c10d weight broadcast.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
build_dir=${BUILD_DIR:-build}
# scripts/test.sh's configuration: running both compiles each file once.
BUILD_DIR="$build_dir" ./scripts/build.sh relay relay-trainer relay-rollout
relay="$build_dir/src/relay"

config=${1:-configs/tiny.yaml}
model_dir=runs/demo/model
echo "== relay config check $config"
"$relay" config check "$config"
echo "== relay init $config --out $model_dir"
"$relay" init "$config" --out "$model_dir" --overwrite
echo "== relay generate (temperature 0.8, seed 1)"
"$relay" generate --model "$model_dir" --text '<3+4+5>' --temperature 0.8 --seed 1 --max-new-tokens 12
echo "== relay generate --json"
gen=$("$relay" generate --model "$model_dir" --ids 1,18,6,13,7,13,8,19 --temperature 0.8 --seed 1 \
        --max-new-tokens 6 --no-eos-stop --json)
echo "$gen"
ids=$(echo "$gen" | sed -E 's/.*"ids":\[([^]]*)\].*/\1/')
echo "== relay score: positions 8.. are the generated tokens; their log-probs at"
echo "   temperature 0.8 equal the ones generate recorded"
"$relay" score --model "$model_dir" --ids "1,18,6,13,7,13,8,19,$ids" --temperature 0.8
echo "== relay rollout: 4 arithmetic prompts x rollout.n samples, scored by the verifier"
"$relay" rollout "$config" --model "$model_dir" --prompts 4 --out runs/demo/rollout.jsonl
head -c 600 runs/demo/rollout.jsonl; echo " ..."
echo "== relay train-local: warm start, then RL on arithmetic; held-out accuracy before and after"
"$relay" train-local "$config" --model "$model_dir" --sft-steps 60 --sft-lr 3e-3 --steps 40 \
  --groups-per-step 16 --eval-prompts 128 --eval-every 20 \
  trainer.lr=1e-4 rollout.n=8 task.arithmetic.max_operands=2 | grep -E '^(eval|step (1|20|40):)'
echo "== relay run configs/arith.yaml: the main job. A fresh model, a supervised warm start,"
echo "   then asynchronous GRPO: relay-trainer and two relay-rollout workers over gRPC, the"
echo "   rollout store and c10d weight broadcast (max_staleness 2)"
rm -rf runs/demo/arith
"$relay" run configs/arith.yaml experiment.output_dir=runs/demo services.weight_sync=broadcast \
  2>/dev/null | grep -E '^(eval|step (1|20|40|60)/|worker .* submitted)'
echo "== relay store inspect: what the trainer consumed, and how stale it was"
"$relay" store inspect runs/demo/arith/store | head -12
