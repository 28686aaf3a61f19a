// relay-rollout: a rollout worker. Registers with relay-trainer, takes its
// weights (digest-checked), leases prompts, generates and scores K samples
// per prompt with the rollout engine, submits the groups, and follows new
// versions between decode steps. Stops on SIGINT/SIGTERM, or when the
// trainer goes away.
//
//   relay-rollout CONFIG [key=value ...] --trainer HOST:PORT [--model DIR] [--name N]
//       [--token T] [--groups-in-flight G]
//
// TLS, the token file, call deadlines and weight sync come from the config's
// services section. On SIGTERM the worker stops generating and gives its
// open leases back, so their prompts are leased again at once. The run
// itself is app/worker_run.h; this file reads the flags.

#include <CLI/CLI.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>

#include "relay/app/setup.h"
#include "relay/app/worker_run.h"
#include "relay/common/logging.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

// The flags into `args`; an exit code when the process should end now
// (--help, a bad flag).
std::optional<int> parse_flags(int argc, char** argv, relay::app::WorkerRunArgs& args) {
  CLI::App cli{"relay-rollout: a rollout worker for relay-trainer"};
  relay::app::SetupArgs& setup = args.setup;
  std::string log_level = "warn";
  cli.add_option("config", setup.config_file, "YAML experiment config (the trainer's)")->required();
  cli.add_option("overrides", setup.overrides, "key.path=value overrides");
  cli.add_option("--model", setup.model_dir,
                 "Model directory for the architecture and tokenizer (default: model.path); "
                 "the weights come from the trainer");
  cli.add_option("--trainer", args.trainer_address, "relay-trainer's gRPC address host:port")
      ->required();
  cli.add_option("--name", args.name, "Worker name shown in the trainer's stats");
  cli.add_option("--token", args.token,
                 "Shared bearer token (default services.token_file, then $RELAY_TOKEN)");
  cli.add_option("--groups-in-flight", args.groups_in_flight,
                 "Leases held at once (default rollout.groups_in_flight)");
  cli.add_option("--reconnect-s", args.reconnect_s,
                 "How long to keep trying to reach the trainer (at start, or after it went away)");
  cli.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : 2;
  }
  if (relay::Status s = relay::init_logging(log_level, "rollout " + args.name); !s.ok()) {
    std::fprintf(stderr, "relay-rollout: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  relay::app::report_uncaught_exceptions("relay-rollout");
  relay::app::WorkerRunArgs args;
  if (std::optional<int> code = parse_flags(argc, argv, args)) return *code;
  // SIGINT and SIGTERM drain once the model is loaded (the leases go back,
  // exit 0); before that they end the process as usual.
  auto on_ready = [] {
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
  };
  return relay::app::run_worker(args, on_ready, [] { return g_stop.load(); });
}
