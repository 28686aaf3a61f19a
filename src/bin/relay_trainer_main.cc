// relay-trainer: the learner process. Serves the worker and admin gRPC
// services over the rollout store and prompt dispenser, trains on groups as
// they arrive (within the staleness bound), and publishes each new version.
//
//   relay-trainer CONFIG [key=value ...] [--run-dir DIR] [--model DIR] [--store DIR]
//       [--listen ADDR] [--port-file F] [--steps N] [--groups-per-step G]
//       [--eval-prompts E] [--eval-every K] [--metrics-out F] [--save DIR] [--token T]
//       [--resume]
//
// Everything else comes from the config (experiment.*, services.*). The run
// directory (default <experiment.output_dir>/<experiment.name>) holds
// config.yaml, metrics.jsonl, checkpoints/ and store/. Started again on the
// same run directory, the trainer resumes from its newest checkpoint
// (checkpoints/step_NNNNNN/) and puts the rollout store and the prompt
// dispenser back where they stood when it was written, so the steps after it
// repeat what an uninterrupted run would do (docs/services.md). The run
// itself is app/trainer_run.h; this file reads the flags.

#include <CLI/CLI.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "relay/app/setup.h"
#include "relay/app/trainer_run.h"
#include "relay/common/logging.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/cpu_memory.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

// The flags into `args`; an exit code when the process should end now
// (--help, a bad flag).
std::optional<int> parse_flags(int argc, char** argv, relay::app::TrainerRunArgs& args) {
  CLI::App cli{"relay-trainer: the learner; serves rollout workers over gRPC"};
  relay::app::SetupArgs& setup = args.setup;
  std::string listen, log_level = "warn";
  std::optional<int64_t> steps, groups_per_step, eval_prompts, eval_every;
  cli.add_option("config", setup.config_file, "YAML experiment config")->required();
  cli.add_option("overrides", setup.overrides, "key.path=value overrides");
  cli.add_option("--run-dir", args.run_dir,
                 "Run directory (default <experiment.output_dir>/<experiment.name>)");
  cli.add_option("--model", setup.model_dir, "Starting model directory (default: model.path)");
  cli.add_option("--store", args.store_dir, "Rollout store directory (default <run dir>/store)");
  cli.add_option("--listen", listen, "gRPC address (default services.listen)");
  cli.add_option("--port-file", args.port_file, "Write the bound port here once serving");
  cli.add_option("--steps", steps, "RL steps (default experiment.steps)");
  cli.add_option("--groups-per-step", groups_per_step, "Groups per step (experiment.*)");
  cli.add_option("--eval-prompts", eval_prompts, "Held-out prompts (eval.prompts)");
  cli.add_option("--eval-every", eval_every, "Evaluate every N steps (eval.every)");
  cli.add_option("--metrics-out", args.metrics_out,
                 "Metrics JSONL (default <run dir>/metrics.jsonl)");
  cli.add_option("--save", args.save, "Also write the trained model here");
  cli.add_option("--token", args.token,
                 "Shared bearer token (default services.token_file, then $RELAY_TOKEN)");
  cli.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  cli.add_flag("--resume", args.resume,
               "Continue from the run directory's newest checkpoint (an error when it has none; "
               "without the flag a run directory with checkpoints is resumed too)");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : 2;
  }
  if (relay::Status s = relay::init_logging(log_level, "trainer"); !s.ok()) {
    std::fprintf(stderr, "relay-trainer: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  // Flags are shorthands for experiment.* overrides, applied last.
  auto shorthand = [&](const char* key, const std::optional<int64_t>& v) {
    if (v) setup.overrides.push_back(absl::StrCat(key, "=", *v));
  };
  shorthand("experiment.steps", steps);
  shorthand("experiment.groups_per_step", groups_per_step);
  shorthand("eval.prompts", eval_prompts);
  shorthand("eval.every", eval_every);
  if (!listen.empty()) setup.overrides.push_back(absl::StrCat("services.listen=", listen));
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  // First: it may start the program again with other BLAS kernels.
  relay::model::choose_blas_kernels(argv);
  // Before any thread starts, and before any tensor is made.
  if (const relay::Status s = relay::model::configure_cpu_memory_from_env(); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", "relay-trainer", std::string(s.message()).c_str());
    return 2;
  }
  relay::app::report_uncaught_exceptions("relay-trainer");
  relay::app::TrainerRunArgs args;
  if (std::optional<int> code = parse_flags(argc, argv, args)) return *code;
  // SIGINT and SIGTERM drain once the services are up (a checkpoint, then
  // exit 0); before that they end the process as usual.
  auto on_serving = [] {
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
  };
  return relay::app::run_trainer(args, on_serving, [] { return g_stop.load(); });
}
