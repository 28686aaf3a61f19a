#!/usr/bin/env bash
# Builds a model directory shaped like Qwen/Qwen2.5-0.5B-Instruct: its
# config.json (494M parameters, an embedding padded to 151,936 rows), its
# tokenizer (the Qwen2/Qwen2.5/Qwen3 byte-level BPE vocabulary), its
# tokenizer_config.json special tokens and generation_config.json end-of-
# sequence ids, and random weights in bfloat16, sharded as a real checkpoint
# is. Real weights cannot be downloaded on these machines; the shapes, the
# files and the memory they take are what matter for trying relay on the
# model a user brings. Also writes a GSM8K-style math JSONL task.
#
#   scripts/models/qwen2.5-0.5b.sh [OUT_DIR]      (default: runs/models/qwen2.5-0.5b)
#
# RELAY      the relay binary (default: build/src/relay)
# TOKENIZER  a Qwen2 tokenizer.json (default: ../shared/testdata/tokenizer_parity/qwen2/tokenizer.json)
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:-runs/models/qwen2.5-0.5b}
relay=${RELAY:-build/src/relay}
tokenizer=${TOKENIZER:-../shared/testdata/tokenizer_parity/qwen2/tokenizer.json}
[ -x "$relay" ] || { echo "$0: no relay binary at $relay (build first, or set RELAY)" >&2; exit 1; }
[ -f "$tokenizer" ] || { echo "$0: no tokenizer at $tokenizer (set TOKENIZER to a Qwen2 tokenizer.json)" >&2; exit 1; }

src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT

# Qwen2.5-0.5B-Instruct's config.json, as published.
cat > "$src/config.json" <<'JSON'
{
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 21,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
JSON
# The special tokens the Instruct model's tokenizer_config.json names, and
# its generation_config.json (two end-of-sequence ids).
cat > "$src/tokenizer_config.json" <<'JSON'
{
  "bos_token": null,
  "eos_token": "<|im_end|>",
  "pad_token": "<|endoftext|>",
  "model_max_length": 131072,
  "tokenizer_class": "Qwen2Tokenizer"
}
JSON
cat > "$src/generation_config.json" <<'JSON'
{
  "bos_token_id": 151643,
  "do_sample": true,
  "eos_token_id": [151645, 151643],
  "pad_token_id": 151643,
  "repetition_penalty": 1.1,
  "temperature": 0.7,
  "top_k": 20,
  "top_p": 0.8
}
JSON
cp "$tokenizer" "$src/tokenizer.json"

mkdir -p "$(dirname "$out")"
"$relay" init configs/tiny.yaml model.dtype=bfloat16 run.seed=0 \
  --hf-config "$src/config.json" --tokenizer "$src" --max-shard-mb 500 --out "$out" --overwrite

# A GSM8K-style task: word problems with a numeric answer, the worked
# solution ending in \boxed{}. Deterministic (seeded awk).
task="$(dirname "$out")/gsm8k_style.jsonl"
awk 'BEGIN {
  srand(7);
  names[0] = "Ava"; names[1] = "Ben"; names[2] = "Chen"; names[3] = "Dana"; names[4] = "Eli";
  items[0] = "apples"; items[1] = "stickers"; items[2] = "marbles"; items[3] = "books";
  for (i = 0; i < 512; i++) {
    n = names[int(rand() * 5)]; it = items[int(rand() * 4)];
    a = 2 + int(rand() * 40); b = 2 + int(rand() * 9); c = 1 + int(rand() * 20);
    ans = a * b - c;
    q = sprintf("%s buys %d boxes of %s with %d %s in each box, then gives away %d %s. How many %s does %s have now?", n, b, it, a, it, c, it, it, n);
    s = sprintf("%s has %d x %d = %d %s, then %d - %d = %d. \\\\boxed{%d}", n, b, a, a * b, it, a * b, c, ans, ans);
    printf("{\"question\": \"%s\", \"answer\": \"%d\", \"solution\": \"%s\"}\n", q, ans, s);
  }
}' > "$task"
echo "wrote $task ($(wc -l < "$task") problems)"
