// relay train-local CONFIG: the whole loop in one process (app/train_local.h).

#include <CLI/CLI.hpp>

#include <memory>

#include "bin/commands.h"
#include "relay/app/train_local.h"

namespace relay::cli {

Command add_train_local_command(CLI::App& relay) {
  auto args = std::make_shared<app::TrainLocalArgs>();
  CLI::App* train = relay.add_subcommand(
      "train-local", "Train in one process: rollout engine, verifier and trainer in a loop");
  train->add_option("config", args->config_file, "YAML experiment config")->required();
  train->add_option("overrides", args->overrides, "key.path=value overrides");
  train->add_option("--model", args->model_dir, "Starting model directory (default: model.path)");
  train->add_option("--steps", args->steps, "RL steps");
  train->add_option("--groups-per-step", args->groups_per_step, "Task prompts per RL step");
  train->add_option("--sft-steps", args->sft_steps, "Warm-start SFT steps on task targets first");
  train->add_option("--sft-lr", args->sft_lr, "Warm-start learning rate (default: trainer.lr)");
  train->add_option("--eval-prompts", args->eval_prompts, "Held-out prompts for greedy accuracy");
  train->add_option("--eval-every", args->eval_every, "Evaluate every N RL steps (0 = ends only)");
  train->add_option("--metrics-out", args->metrics_out, "Write each step's metrics as JSONL here");
  train->add_option("--save", args->save, "Write the trained model here");
  return {train, [args] { return app::train_local(*args); }};
}

}  // namespace relay::cli
