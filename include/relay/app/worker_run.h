#pragma once

// relay-rollout's run (docs/services.md): registers with relay-trainer
// (retrying while it is unreachable), takes its weights, and runs the
// rollout worker (comm/worker/rollout_worker.h) until the run is finished,
// the process is told to stop, or the trainer goes away for longer than
// `reconnect_s`. TLS, the token file, call deadlines and weight sync come
// from the config's services section.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "relay/app/setup.h"

namespace relay::app {

struct WorkerRunArgs {
  SetupArgs setup;              // config, overrides, --model (architecture and tokenizer)
  std::string trainer_address;  // host:port
  std::string name = "worker";  // shown in the trainer's stats
  std::string token;            // bearer token; empty = services.token_file, then $RELAY_TOKEN
  std::optional<int64_t> groups_in_flight;  // default rollout.groups_in_flight
  // How long to keep trying to reach the trainer, at the start or after it
  // went away.
  int64_t reconnect_s = 60;
  // rollout.agent.command: starts the agent program once the worker's
  // endpoint listens, with `env` ("NAME=value": OPENAI_BASE_URL,
  // OPENAI_API_KEY, RELAY_MODEL) added to its environment. relay-rollout
  // owns the process (bin/relay_rollout_main.cc); unset = this program
  // cannot start one, which is an error when the config names a command.
  std::function<Status(const std::vector<std::string>& command,
                       const std::vector<std::string>& env)>
      start_agent;
};

// The whole run; returns the exit code. 0: stopped by `stop` (the open
// leases are given back), the run is finished, or the trainer went away for
// good; 1 with "relay-rollout: <message>" on stderr otherwise. `on_ready` is
// called once the model is loaded, before the first call to the trainer
// (the caller installs its signal handlers then).
int run_worker(const WorkerRunArgs& args, const std::function<void()>& on_ready,
               const std::function<bool()>& stop);

}  // namespace relay::app
