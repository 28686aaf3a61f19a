#pragma once

// relay-trainer's run (docs/services.md): the run directory, resume or a
// fresh start (evaluation, warm start, checkpoint zero), the gRPC services
// over the rollout store and prompt dispenser, and the training loop over
// the groups workers submit. With trainer.world_size > 1 this process is
// one rank: rank 0 runs all of that, the others follow its trainer calls
// (app/trainer_ranks.h).

#include <functional>
#include <string>

#include "relay/app/setup.h"

namespace relay::app {

struct TrainerRunArgs {
  SetupArgs setup;          // config, overrides (the flags' shorthands included), --model
  std::string run_dir;      // default <experiment.output_dir>/<experiment.name>
  std::string store_dir;    // default <run dir>/store
  std::string metrics_out;  // default <run dir>/metrics.jsonl
  std::string port_file;    // the bound port is written here once serving; empty = no
  std::string save;         // also write the trained model here; empty = no
  std::string token;        // bearer token; empty = services.token_file, then $RELAY_TOKEN
  bool resume = false;      // require a checkpoint to continue from
};

// The whole run; returns the exit code (0 done or stopped cleanly, 1 with
// "relay-trainer: <message>" on stderr). `on_serving` is called once the
// services listen (the caller installs its signal handlers then); `stop`
// turning true after that (SIGTERM) drains: the step under way finishes and
// a checkpoint is written.
int run_trainer(const TrainerRunArgs& args, const std::function<void()>& on_serving,
                const std::function<bool()>& stop);

}  // namespace relay::app
