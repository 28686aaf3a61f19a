#pragma once

// The `relay` command line's subcommands, one function each. Each returns the
// process exit code: 0 on success, 1 when the input is bad or an operation
// fails (with a one-line message on stderr), never an uncaught exception.
// Results go to stdout; logs go to stderr.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "relay/app/train_local.h"

namespace relay::cli {

struct ConfigCheckArgs {
  std::string file;
  std::vector<std::string> overrides;  // key.path=value
};
int config_check(const ConfigCheckArgs& args);

struct InitArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  std::string out_dir;
  bool overwrite = false;
  // An HF config.json whose architecture to build instead of model.init's.
  std::string hf_config;
  // A tokenizer.json, or a directory holding one (its tokenizer_config.json,
  // special_tokens_map.json and generation_config.json are copied too);
  // empty = relay's char tokenizer.
  std::string tokenizer;
  int64_t max_shard_mb = 0;  // shard the weights into files of this size; 0 = 5 GB
};
// Writes a fresh model directory (HF layout + tokenizer) from model.init, or
// from an HF config.json, with random weights seeded by run.seed in
// model.dtype.
int init_model(const InitArgs& args);

struct ScoreArgs {
  std::string model_dir;
  std::string ids;  // "1,2,3"
  bool json = false;
  bool logits = false;
  double temperature = 1.0;
};
int score(const ScoreArgs& args);

struct GenerateArgs {
  std::string model_dir;
  std::string ids;   // "1,2,3"; or
  std::string text;  // encoded with the directory's tokenizer
  // none | chatml | llama3 | auto: render `text` as a user message (after
  // `system_prompt`, if any) and stop at the end-of-turn token too.
  std::string chat_template = "none";
  std::string system_prompt;
  int64_t max_new_tokens = 16;
  bool greedy = false;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::string stop;  // extra stop ids "2,5"; the tokenizer's EOS always stops
  bool no_eos_stop = false;
  bool json = false;
};
int generate(const GenerateArgs& args);

struct RolloutArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  std::string model_dir;  // default: model.path
  int64_t prompts = 8;    // groups to sample: task prompts [start, start + prompts)
  int64_t start = 0;
  std::string out;    // JSONL, one trajectory group per line; empty = no file
  std::string store;  // rollout store directory to append the groups to; empty = none
};
// Samples rollout.n responses for each of a range of task prompts with the
// rollout engine, scores them with the task's verifier and writes them out.
int rollout(const RolloutArgs& args);

struct RunArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  std::string model_dir;  // default: model.path
  std::string store;      // default: <experiment.output_dir>/<experiment.name>/store
  // Shorthands for config overrides (rollout.workers, experiment.steps, ...).
  std::optional<int64_t> workers, groups_in_flight, steps, groups_per_step, eval_prompts,
      eval_every;
  std::string metrics_out;  // default: <run dir>/metrics.jsonl
  std::string save;
  bool resume = false;  // require a checkpoint to continue from
};
// relay-trainer and rollout.workers relay-rollout processes on this machine,
// supervised (a worker that dies is restarted); returns the trainer's exit
// code.
int run(const RunArgs& args);

struct EvalArgs {
  std::string model_dir;    // HF-layout model directory (weights and tokenizer)
  std::string config_file;  // experiment config: its task and eval sections
  std::vector<std::string> overrides;
  std::optional<int64_t> n, prompts;  // eval.n, eval.prompts
  std::optional<double> temperature;  // eval.temperature
  bool json = false;
};
// Greedy accuracy and pass@k of a model on the task's held-out prompts.
int eval_model(const EvalArgs& args);

struct StoreInspectArgs {
  std::string path;
  bool json = false;
};
// Counts, staleness and a sample trajectory of a rollout store (read-only).
int store_inspect(const StoreInspectArgs& args);

// relay train-local (app/train_local.h).
using app::train_local;
using app::TrainLocalArgs;

struct TokenizeArgs {
  std::string tokenizer;  // a tokenizer file, or a model directory holding one
  std::string text;       // text to encode
  bool decode = false;    // decode `ids` instead
  std::string ids;        // "1,2,3", with decode
  bool json = false;      // print {"ids": [...]} or {"text": "..."}
};
// Encodes text (prints the ids, comma-separated) or decodes ids (prints the
// text) with relay's or a Hugging Face tokenizer.
int tokenize(const TokenizeArgs& args);

struct ReportArgs {
  std::string run_dir;       // holds metrics.jsonl; samples.jsonl and config.yaml if present
  std::string out;           // default: <run_dir>/report.html
  int64_t sample_steps = 4;  // the last N steps of samples.jsonl are shown
};
// Writes the run dashboard as one self-contained HTML file (docs/dashboard.md)
// and prints its path.
int report(const ReportArgs& args);

// "1, 2,3" -> {1, 2, 3}; errors name the bad item.
bool parse_ids(const std::string& text, std::vector<int64_t>* ids, std::string* error);

}  // namespace relay::cli
