// relay config check FILE [key=value ...]: validates an experiment config
// (every problem at once, each naming its key) and prints it resolved.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bin/commands.h"
#include "relay/config/config.h"

namespace relay::cli {
namespace {

struct ConfigCheckArgs {
  std::string file;
  std::vector<std::string> overrides;  // key.path=value
};

int config_check(const ConfigCheckArgs& args) {
  StatusOr<ExperimentConfig> config = load_config(args.file, args.overrides);
  if (!config.ok()) return fail("config check", config.status());
  std::cout << to_yaml(*config);
  std::fprintf(stderr, "%s: ok\n", args.file.c_str());
  return 0;
}

}  // namespace

Command add_config_command(CLI::App& relay) {
  auto args = std::make_shared<ConfigCheckArgs>();
  CLI::App* config = relay.add_subcommand("config", "Experiment configs");
  config->require_subcommand(1);
  CLI::App* check = config->add_subcommand("check", "Validate a config and print it resolved");
  check->add_option("file", args->file, "YAML experiment config")->required();
  check->add_option("overrides", args->overrides, "key.path=value overrides");
  // `check` is config's only subcommand, and required.
  return {config, [args] { return config_check(*args); }};
}

}  // namespace relay::cli
