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
// itself is app/worker_run.h; this file reads the flags, and owns the agent
// program of rollout.agent.command: started once the worker's endpoint
// listens, stopped (SIGTERM) when the worker stops; if it exits first, the
// worker stops too, gives its leases back and exits 1 saying how it ended.

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "bin/child_process.h"
#include "relay/app/setup.h"
#include "relay/app/worker_run.h"
#include "relay/common/logging.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/cpu_memory.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

// rollout.agent.command, once started.
struct Agent {
  pid_t pid = -1;
  std::string command;
  std::optional<relay::cli::ChildExit> exit;  // set when it ended by itself
};
Agent g_agent;

// Whether the agent program has ended (and how, in g_agent.exit).
bool agent_ended() {
  if (g_agent.pid < 0 || g_agent.exit) return g_agent.exit.has_value();
  g_agent.exit = relay::cli::poll_exit(g_agent.pid);
  return g_agent.exit.has_value();
}

relay::Status start_agent(const std::vector<std::string>& command,
                          const std::vector<std::string>& env) {
  // env searches PATH for the program, as a shell would.
  std::vector<std::string> args{"/usr/bin/env"};
  args.insert(args.end(), command.begin(), command.end());
  relay::StatusOr<pid_t> pid = relay::cli::spawn(args, env);
  if (!pid.ok()) return pid.status();
  g_agent.pid = *pid;
  g_agent.command = absl::StrJoin(command, " ");
  std::printf("relay-rollout: started the agent (pid %d): %s\n", static_cast<int>(*pid),
              g_agent.command.c_str());
  std::fflush(stdout);
  return relay::OkStatus();
}

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
  // First: it may start the program again with other BLAS kernels.
  relay::model::choose_blas_kernels(argv);
  // Before any thread starts, and before any tensor is made.
  if (const relay::Status s = relay::model::configure_cpu_memory_from_env(); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", "relay-rollout", std::string(s.message()).c_str());
    return 2;
  }
  relay::app::report_uncaught_exceptions("relay-rollout");
  relay::app::WorkerRunArgs args;
  if (std::optional<int> code = parse_flags(argc, argv, args)) return *code;
  // SIGINT and SIGTERM drain once the model is loaded (the leases go back,
  // exit 0); before that they end the process as usual.
  auto on_ready = [] {
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
  };
  args.start_agent = start_agent;
  const int code =
      relay::app::run_worker(args, on_ready, [] { return g_stop.load() || agent_ended(); });
  if (g_agent.pid < 0) return code;
  if (g_agent.exit && !g_stop.load()) {
    // The agent ended while the worker could go on: nothing plays its episodes.
    std::fprintf(stderr,
                 "relay-rollout: the agent (rollout.agent.command: %s) %s before the worker "
                 "stopped\n",
                 g_agent.command.c_str(), relay::cli::describe_exit(*g_agent.exit).c_str());
    return code == 0 ? 1 : code;
  }
  if (!g_agent.exit) relay::cli::stop_child(g_agent.pid, std::chrono::seconds(10));
  return code;
}
