// relay: the command line for people. Thin: each subcommand registers its
// own flags and code (bin/commands.h); this file lists them and dispatches.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "bin/commands.h"
#include "relay/app/setup.h"
#include "relay/common/logging.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/cpu_memory.h"

int main(int argc, char** argv) {
  using namespace relay::cli;
  // First: it may start the program again with other BLAS kernels.
  relay::model::choose_blas_kernels(argv);
  // Before any thread starts, and before any tensor is made.
  if (const relay::Status s = relay::model::configure_cpu_memory_from_env(); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", "relay", std::string(s.message()).c_str());
    return 2;
  }
  relay::app::report_uncaught_exceptions("relay");
  CLI::App app{"relay: asynchronous RL post-training for LLMs"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off (stderr)");
  const std::vector<Command> commands = {
      add_config_command(app),      add_init_command(app),     add_score_command(app),
      add_tokenize_command(app),    add_generate_command(app), add_rollout_command(app),
      add_run_command(app),         add_eval_command(app),     add_store_command(app),
      add_train_local_command(app), add_report_command(app),   add_serve_command(app),
      add_export_command(app),      add_env_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (relay::Status s = relay::init_logging(log_level); !s.ok()) {
    std::fprintf(stderr, "relay: --%s\n", std::string(s.message()).c_str());
    return 2;
  }
  for (const Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return 2;
}
