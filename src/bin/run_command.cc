// relay run: relay-trainer and rollout.workers relay-rollout workers on this
// machine as child processes, supervised: the trainer's port is handed to the
// workers, a worker that dies is restarted (unless it died the same way 3
// times in a row; bin/supervise.h), the trainer is stopped once no worker is
// left, the cores are split between the processes, the workers are stopped
// when the trainer ends, and Ctrl-C (or SIGTERM) drains them all: workers
// give their leases back, the trainer checkpoints. With trainer.world_size > 1 it starts that many
// trainer ranks, torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

#include <signal.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bin/child_process.h"
#include "bin/commands.h"
#include "bin/run_supervisor.h"
#include "relay/config/config.h"

namespace relay::cli {
namespace {

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted = true; }

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

int fail(const Status& s) { return cli::fail("run", s); }

// The flags as config overrides, checked by loading the config once here.
// With run.threads 0 the processes share the machine's cores by who is
// working (run.core_share, model/core_share.h): a fixed split of cores /
// (processes) left the trainer on one of 2 cores while the other slept
// (docs/rollout.md, "Threads"). `core_share` is the file they share.
StatusOr<std::vector<std::string>> resolved_overrides(const RunArgs& args, ExperimentConfig* config,
                                                      std::string* core_share) {
  std::vector<std::string> overrides = args.overrides;
  auto shorthand = [&](const std::optional<int64_t>& v, const char* key) {
    if (v) overrides.push_back(absl::StrCat(key, "=", *v));
  };
  shorthand(args.workers, "rollout.workers");
  shorthand(args.groups_in_flight, "rollout.groups_in_flight");
  shorthand(args.steps, "experiment.steps");
  shorthand(args.groups_per_step, "experiment.groups_per_step");
  shorthand(args.eval_prompts, "eval.prompts");
  shorthand(args.eval_every, "eval.every");
  RELAY_ASSIGN_OR_RETURN(*config, load_config(args.config_file, overrides));
  if (config->run.threads == 0 && config->run.core_share.empty()) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    *core_share = (std::filesystem::path(config->experiment.output_dir) / config->experiment.name /
                   absl::StrCat("cores.", ::getpid()))
                      .string();
    overrides.push_back(absl::StrCat("run.threads=", cores));
    overrides.push_back(absl::StrCat("run.core_share=", *core_share));
  }
  return overrides;
}

StatusOr<RunPlan> plan_run(const RunArgs& args) {
  ExperimentConfig config;
  std::string core_share;
  RELAY_ASSIGN_OR_RETURN(std::vector<std::string> overrides,
                         resolved_overrides(args, &config, &core_share));
  RunPlan plan;
  plan.core_share = core_share;
  plan.workers = config.rollout.workers;
  plan.ranks = config.trainer.data_parallel.world_size;
  const std::string run_dir =
      (std::filesystem::path(config.experiment.output_dir) / config.experiment.name).string();
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) return InternalError(absl::StrCat("cannot create ", run_dir, ": ", ec.message()));
  plan.port_file = absl::StrCat(run_dir, "/trainer.port.", ::getpid());
  std::filesystem::remove(plan.port_file, ec);
  if (!plan.core_share.empty()) {
    std::filesystem::remove(plan.core_share, ec);
    // OpenBLAS's threads spin for 2^28 cycles (~0.1 s) after each product
    // before they sleep: a process whose share just shrank, or that just
    // marked itself waiting, would hold the cores it gave up that long. 2^4
    // cycles: they sleep at once and are woken for the next product. On
    // configs/arith.yaml with max_staleness 0 (the processes alternate
    // every ~50 ms) that took the share from 0.61-0.81x of the fixed split to
    // 0.82-0.95x (docs/BENCHMARKS.md, "Sharing the cores"). The children
    // inherit it; a value already set wins.
    ::setenv("OPENBLAS_THREAD_TIMEOUT", "4", /*overwrite=*/0);
  }

  plan.bin_dir = own_dir();
  plan.common = {args.config_file};
  for (const std::string& o : overrides) plan.common.push_back(o);
  if (!args.model_dir.empty()) {
    plan.common.push_back("--model");
    plan.common.push_back(args.model_dir);
  }
  plan.trainer = {plan.bin_dir + "/relay-trainer"};
  plan.trainer.insert(plan.trainer.end(), plan.common.begin(), plan.common.end());
  for (const std::string& a :
       std::vector<std::string>{"--run-dir", run_dir, "--port-file", plan.port_file}) {
    plan.trainer.push_back(a);
  }
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--store", args.store}, {"--metrics-out", args.metrics_out}, {"--save", args.save}}) {
    if (value.empty()) continue;
    plan.trainer.push_back(flag);
    plan.trainer.push_back(value);
  }
  if (args.resume) plan.trainer.push_back("--resume");
  if (plan.ranks > 1) {
    RELAY_ASSIGN_OR_RETURN(int master_port, free_loopback_port());
    plan.rank_env = {"MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", master_port),
                     absl::StrCat("WORLD_SIZE=", plan.ranks)};
  }
  return plan;
}

// Removes the run's core share file on every way out of run(): it is this
// run's alone (named by the supervisor's pid), and its children are gone.
struct RemoveOnReturn {
  std::string path;
  ~RemoveOnReturn() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove(path, ec);
  }
};

int run(const RunArgs& args) {
  StatusOr<RunPlan> plan = plan_run(args);
  if (!plan.ok()) return fail(plan.status());
  const RemoveOnReturn core_share{plan->core_share};
  ::signal(SIGINT, on_signal);
  ::signal(SIGTERM, on_signal);
  TrainerRanks ranks;
  if (Status st = ranks.start(*plan); !st.ok()) return fail(st);
  const auto interrupted = [] { return g_interrupted.load(); };
  StatusOr<std::string> port = ranks.wait_for_port(plan->port_file, interrupted);
  if (absl::IsCancelled(port.status())) {
    const ChildExit e = stop_child(ranks.leader(), std::chrono::seconds(30));
    ranks.stop_followers(std::chrono::seconds(10));
    return shell_code(e);
  }
  if (!port.ok()) return fail(port.status());
  WorkerPool pool(*plan, *port);
  if (Status st = pool.start(); !st.ok()) {
    stop_child(ranks.leader(), std::chrono::seconds(30));
    ranks.stop_followers(std::chrono::seconds(10));
    return fail(st);
  }
  const RunEnd end = supervise(ranks, pool, interrupted);
  pool.stop();
  // Rank 0 stops the others on its way out; a rank still running 10 s later
  // is killed.
  const int follower_code = ranks.stop_followers(std::chrono::seconds(10));
  const int trainer_code = shell_code(end.trainer);
  if (trainer_code != 0) {
    std::fprintf(stderr, "relay run: relay-trainer %s\n", describe_exit(end.trainer).c_str());
  }
  if (!end.workers_gone.empty()) {
    // Last, after the trainer's own lines: the reason the run ended.
    std::fprintf(stderr, "relay run: %s\n", end.workers_gone.c_str());
    return trainer_code != 0 ? trainer_code : 1;
  }
  return trainer_code != 0 ? trainer_code : follower_code;
}

}  // namespace

Command add_run_command(CLI::App& relay) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* run = relay.add_subcommand(
      "run", "Train asynchronously: relay-trainer and rollout workers as child processes");
  run->add_option("config", args->config_file, "YAML experiment config")->required();
  run->add_option("overrides", args->overrides, "key.path=value overrides");
  run->add_option("--model", args->model_dir, "Starting model directory (default: model.path)");
  run->add_option("--store", args->store, "Rollout store (default: <run dir>/store)");
  run->add_option("--workers", args->workers, "Rollout worker processes (rollout.workers)");
  run->add_option("--groups-in-flight", args->groups_in_flight,
                  "Leases per worker (rollout.groups_in_flight)");
  run->add_option("--steps", args->steps, "RL steps (experiment.steps)");
  run->add_option("--groups-per-step", args->groups_per_step,
                  "Prompt groups per step (experiment.groups_per_step)");
  run->add_option("--eval-prompts", args->eval_prompts,
                  "Held-out prompts for accuracy (eval.prompts)");
  run->add_option("--eval-every", args->eval_every, "Evaluate every N steps (eval.every)");
  run->add_option("--metrics-out", args->metrics_out,
                  "Each step's metrics as JSONL (default <run dir>/metrics.jsonl)");
  run->add_option("--save", args->save, "Write the trained model here");
  run->add_flag("--resume", args->resume,
                "Continue from the run directory's newest checkpoint (an error when there is "
                "none; a run directory with checkpoints is resumed without it too)");
  return {run, [args] { return cli::run(*args); }};
}

}  // namespace relay::cli
