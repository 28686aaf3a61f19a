// relay store ...: the rollout store from the command line.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "bin/commands.h"
#include "relay/store/inspect.h"
#include "relay/store/rollout_store.h"

namespace relay::cli {
namespace {

struct StoreInspectArgs {
  std::string path;
  bool json = false;
};

// Counts, staleness and a sample trajectory of a rollout store (read-only).
int store_inspect(const StoreInspectArgs& args) {
  store::StoreOptions o;
  o.path = args.path;
  o.read_only = true;  // next to a running trainer, which holds the lock
  StatusOr<std::unique_ptr<store::RolloutStore>> db = store::RolloutStore::open(o);
  if (!db.ok()) return fail("store inspect", db.status());
  StatusOr<store::StoreReport> report = store::build_report(**db);
  if (!report.ok()) return fail("store inspect", report.status());
  const std::string text = args.json ? store::report_json(*report) : store::report_text(*report);
  std::fputs(text.c_str(), stdout);
  if (args.json) std::fputs("\n", stdout);
  return 0;
}

}  // namespace

Command add_store_command(CLI::App& relay) {
  auto args = std::make_shared<StoreInspectArgs>();
  CLI::App* store = relay.add_subcommand("store", "The rollout store");
  store->require_subcommand(1);
  CLI::App* inspect = store->add_subcommand(
      "inspect", "Counts by version and state, staleness, reward means and a sample trajectory");
  inspect->add_option("path", args->path, "Rollout store directory")->required();
  inspect->add_flag("--json", args->json, "Print JSON");
  // `inspect` is store's only subcommand, and required.
  return {store, [args] { return store_inspect(*args); }};
}

}  // namespace relay::cli
