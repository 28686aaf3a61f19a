// relay store ...: the rollout store from the command line.

#include <cstdio>
#include <string>

#include "bin/commands.h"
#include "relay/store/inspect.h"
#include "relay/store/rollout_store.h"

namespace relay::cli {

int store_inspect(const StoreInspectArgs& args) {
  store::StoreOptions o;
  o.path = args.path;
  o.read_only = true;  // next to a running trainer, which holds the lock
  StatusOr<std::unique_ptr<store::RolloutStore>> db = store::RolloutStore::open(o);
  if (!db.ok()) {
    std::fprintf(stderr, "relay store inspect: %s\n", std::string(db.status().message()).c_str());
    return 1;
  }
  StatusOr<store::StoreReport> report = store::build_report(**db);
  if (!report.ok()) {
    std::fprintf(stderr, "relay store inspect: %s\n",
                 std::string(report.status().message()).c_str());
    return 1;
  }
  const std::string text = args.json ? store::report_json(*report) : store::report_text(*report);
  std::fputs(text.c_str(), stdout);
  if (args.json) std::fputs("\n", stdout);
  return 0;
}

}  // namespace relay::cli
