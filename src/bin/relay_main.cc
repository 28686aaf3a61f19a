// relay: the command line for people. Thin: parses arguments, calls
// src/bin/commands.cc.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "bin/commands.h"
#include "relay/app/setup.h"
#include "relay/common/logging.h"

int main(int argc, char** argv) {
  relay::app::report_uncaught_exceptions("relay");
  CLI::App app{"relay: asynchronous RL post-training for LLMs"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off (stderr)");

  // relay config check FILE [key=value ...]
  auto* config = app.add_subcommand("config", "Experiment configs");
  config->require_subcommand(1);
  relay::cli::ConfigCheckArgs check_args;
  auto* check = config->add_subcommand("check", "Validate a config and print it resolved");
  check->add_option("file", check_args.file, "YAML experiment config")->required();
  check->add_option("overrides", check_args.overrides, "key.path=value overrides");

  relay::cli::InitArgs init_args;
  auto* init = app.add_subcommand("init", "Write a fresh model directory from model.init");
  init->add_option("config", init_args.config_file, "YAML experiment config")->required();
  init->add_option("overrides", init_args.overrides, "key.path=value overrides");
  init->add_option("--out", init_args.out_dir, "Model directory to create")->required();
  init->add_flag("--overwrite", init_args.overwrite, "Replace an existing directory");
  init->add_option("--hf-config", init_args.hf_config,
                   "Build this Hugging Face config.json's architecture instead of model.init's");
  init->add_option("--tokenizer", init_args.tokenizer,
                   "tokenizer.json, or a directory with one (and tokenizer_config.json, "
                   "generation_config.json), to write with the model");
  init->add_option("--max-shard-mb", init_args.max_shard_mb,
                   "Shard the weights into safetensors files of this size");

  relay::cli::ScoreArgs score_args;
  auto* score =
      app.add_subcommand("score", "Per-token log-probs of a sequence: position t scores token t+1");
  score->add_option("--model", score_args.model_dir, "HF-layout model directory")->required();
  score->add_option("--ids", score_args.ids, "Token ids, comma-separated")->required();
  score->add_option("--temperature", score_args.temperature, "Divide logits by this first");
  score->add_flag("--json", score_args.json, "Print {\"logprobs\": [...]}");
  score->add_flag("--logits", score_args.logits, "With --json, also print the logit rows");

  relay::cli::TokenizeArgs tok;
  auto* tokenize = app.add_subcommand("tokenize", "Encode text to ids, or decode ids to text");
  tokenize->add_option("--tokenizer", tok.tokenizer, "Tokenizer file or model directory")
      ->required();
  auto* tok_text = tokenize->add_option("--text", tok.text, "Text to encode");
  auto* tok_decode = tokenize->add_flag("--decode", tok.decode, "Decode --ids instead");
  auto* tok_ids = tokenize->add_option("--ids", tok.ids, "Token ids to decode, comma-separated");
  tok_decode->needs(tok_ids)->excludes(tok_text);
  tok_ids->needs(tok_decode);
  tok_text->excludes(tok_decode);
  tokenize->add_flag("--json", tok.json, "Print {\"ids\": [...]} or {\"text\": ...}");

  relay::cli::GenerateArgs gen;
  auto* generate = app.add_subcommand("generate", "Sample a continuation with the KV cache");
  generate->add_option("--model", gen.model_dir, "HF-layout model directory")->required();
  auto* ids_opt = generate->add_option("--ids", gen.ids, "Prompt token ids, comma-separated");
  auto* text_opt =
      generate->add_option("--text", gen.text, "Prompt text (uses the model's tokenizer)");
  ids_opt->excludes(text_opt);
  auto* chat_opt =
      generate
          ->add_option("--chat-template", gen.chat_template,
                       "Render --text as a chat user message: none | chatml | llama3 | auto")
          ->needs(text_opt);
  generate->add_option("--system", gen.system_prompt, "System message (with --chat-template)")
      ->needs(chat_opt);
  generate->add_option("--max-new-tokens", gen.max_new_tokens, "Tokens to generate at most");
  auto* greedy = generate->add_flag("--greedy", gen.greedy, "Argmax decoding");
  generate->add_option("--temperature", gen.temperature, "Sampling temperature (> 0)")
      ->excludes(greedy);
  generate->add_option("--top-k", gen.top_k, "Keep the k most likely tokens (0 = off)");
  generate->add_option("--top-p", gen.top_p, "Nucleus mass in (0, 1] (1 = off)");
  generate->add_option("--seed", gen.seed, "Sampling seed");
  generate->add_option("--stop", gen.stop, "Extra stop token ids, comma-separated");
  generate->add_flag("--no-eos-stop", gen.no_eos_stop, "Do not stop at the tokenizer's EOS");
  generate->add_flag("--json", gen.json, "Print {\"ids\": [...], \"logprobs\": [...]}");

  relay::cli::RolloutArgs roll;
  auto* rollout = app.add_subcommand(
      "rollout", "Sample K responses per task prompt with the rollout engine and score them");
  rollout->add_option("config", roll.config_file, "YAML experiment config")->required();
  rollout->add_option("overrides", roll.overrides, "key.path=value overrides");
  rollout->add_option("--model", roll.model_dir, "HF-layout model directory (default: model.path)");
  rollout->add_option("--prompts", roll.prompts, "Number of task prompts (groups)");
  rollout->add_option("--start", roll.start, "Index of the first task prompt");
  rollout->add_option("--out", roll.out, "Write trajectory groups as JSONL here");
  rollout->add_option("--store", roll.store, "Append the groups to this rollout store");

  relay::cli::RunArgs run_args;
  auto* run = app.add_subcommand(
      "run", "Train asynchronously: relay-trainer and rollout workers as child processes");
  run->add_option("config", run_args.config_file, "YAML experiment config")->required();
  run->add_option("overrides", run_args.overrides, "key.path=value overrides");
  run->add_option("--model", run_args.model_dir, "Starting model directory (default: model.path)");
  run->add_option("--store", run_args.store, "Rollout store (default: <run dir>/store)");
  run->add_option("--workers", run_args.workers, "Rollout worker processes (rollout.workers)");
  run->add_option("--groups-in-flight", run_args.groups_in_flight,
                  "Leases per worker (rollout.groups_in_flight)");
  run->add_option("--steps", run_args.steps, "RL steps (experiment.steps)");
  run->add_option("--groups-per-step", run_args.groups_per_step,
                  "Prompt groups per step (experiment.groups_per_step)");
  run->add_option("--eval-prompts", run_args.eval_prompts,
                  "Held-out prompts for accuracy (eval.prompts)");
  run->add_option("--eval-every", run_args.eval_every, "Evaluate every N steps (eval.every)");
  run->add_option("--metrics-out", run_args.metrics_out,
                  "Each step's metrics as JSONL (default <run dir>/metrics.jsonl)");
  run->add_option("--save", run_args.save, "Write the trained model here");
  run->add_flag("--resume", run_args.resume,
                "Continue from the run directory's newest checkpoint (an error when there is "
                "none; a run directory with checkpoints is resumed without it too)");

  relay::cli::EvalArgs eval_args;
  auto* eval = app.add_subcommand(
      "eval", "Held-out greedy accuracy and pass@k of a model on a task, with the rollout engine");
  eval->add_option("--model", eval_args.model_dir, "HF-layout model directory")->required();
  eval->add_option("--task", eval_args.config_file,
                   "Experiment config whose task and eval sections to use")
      ->required();
  eval->add_option("overrides", eval_args.overrides, "key.path=value overrides");
  eval->add_option("--n", eval_args.n, "Samples per prompt for pass@k (eval.n; 0 = greedy only)");
  eval->add_option("--prompts", eval_args.prompts, "Held-out prompts (eval.prompts)");
  eval->add_option("--temperature", eval_args.temperature,
                   "Sampling temperature of the n samples (eval.temperature)");
  eval->add_flag("--json", eval_args.json, "Print one JSON object");

  relay::cli::StoreInspectArgs inspect_args;
  auto* store = app.add_subcommand("store", "The rollout store");
  store->require_subcommand(1);
  auto* inspect = store->add_subcommand(
      "inspect", "Counts by version and state, staleness, reward means and a sample trajectory");
  inspect->add_option("path", inspect_args.path, "Rollout store directory")->required();
  inspect->add_flag("--json", inspect_args.json, "Print JSON");

  relay::cli::TrainLocalArgs tl;
  auto* train = app.add_subcommand(
      "train-local", "Train in one process: rollout engine, verifier and trainer in a loop");
  train->add_option("config", tl.config_file, "YAML experiment config")->required();
  train->add_option("overrides", tl.overrides, "key.path=value overrides");
  train->add_option("--model", tl.model_dir, "Starting model directory (default: model.path)");
  train->add_option("--steps", tl.steps, "RL steps");
  train->add_option("--groups-per-step", tl.groups_per_step, "Task prompts per RL step");
  train->add_option("--sft-steps", tl.sft_steps, "Warm-start SFT steps on task targets first");
  train->add_option("--sft-lr", tl.sft_lr, "Warm-start learning rate (default: trainer.lr)");
  train->add_option("--eval-prompts", tl.eval_prompts, "Held-out prompts for greedy accuracy");
  train->add_option("--eval-every", tl.eval_every, "Evaluate every N RL steps (0 = ends only)");
  train->add_option("--metrics-out", tl.metrics_out, "Write each step's metrics as JSONL here");
  train->add_option("--save", tl.save, "Write the trained model here");

  relay::cli::ReportArgs report_args;
  auto* report = app.add_subcommand(
      "report", "Write a run's dashboard (charts, latest samples) as one self-contained HTML file");
  report->add_option("run_dir", report_args.run_dir, "Run directory (holds metrics.jsonl)")
      ->required();
  report->add_option("--out", report_args.out, "HTML file to write (default RUN_DIR/report.html)");
  report->add_option("--sample-steps", report_args.sample_steps,
                     "Show the sampled responses of the last N steps");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (relay::Status s = relay::init_logging(log_level); !s.ok()) {
    std::fprintf(stderr, "relay: --%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (*check) return relay::cli::config_check(check_args);
  if (*init) return relay::cli::init_model(init_args);
  if (*score) return relay::cli::score(score_args);
  if (*generate) return relay::cli::generate(gen);
  if (*tokenize) {
    if (!tok.decode && tok_text->count() == 0) {
      std::fprintf(stderr, "relay tokenize: give --text, or --decode with --ids\n");
      return 1;
    }
    return relay::cli::tokenize(tok);
  }
  if (*rollout) return relay::cli::rollout(roll);
  if (*train) return relay::cli::train_local(tl);
  if (*inspect) return relay::cli::store_inspect(inspect_args);
  if (*run) return relay::cli::run(run_args);
  if (*eval) return relay::cli::eval_model(eval_args);
  if (*report) return relay::cli::report(report_args);
  return 2;
}
