// relay-rollout: a rollout worker. Registers with relay-trainer, takes its
// weights (digest-checked), leases prompts, generates and scores K samples
// per prompt with the rollout engine, submits the groups, and follows new
// versions between decode steps. Stops on SIGINT/SIGTERM, or when the
// trainer goes away.
//
//   relay-rollout CONFIG [key=value ...] --trainer HOST:PORT [--model DIR] [--name N]
//       [--token T] [--groups-in-flight G] [--tls-ca F [--tls-cert F --tls-key F]]

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "bin/setup.h"
#include "relay/comm/rollout_worker.h"
#include "relay/common/logging.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

}  // namespace

int main(int argc, char** argv) {
  using namespace relay;
  CLI::App app{"relay-rollout: a rollout worker for relay-trainer"};
  cli::RolloutArgs ra;
  comm::ClientOptions co;
  comm::RolloutWorkerOptions wo;
  std::string log_level = "warn";
  int64_t timeout_ms = 30000;
  app.add_option("config", ra.config_file, "YAML experiment config (the trainer's)")->required();
  app.add_option("overrides", ra.overrides, "key.path=value overrides");
  app.add_option("--model", ra.model_dir,
                 "Model directory for the architecture and tokenizer (default: model.path); "
                 "the weights come from the trainer");
  app.add_option("--trainer", co.address, "relay-trainer's gRPC address host:port")->required();
  app.add_option("--name", wo.name, "Worker name shown in the trainer's stats");
  app.add_option("--token", co.auth_token, "Shared bearer token (default: $RELAY_TOKEN)");
  app.add_option("--groups-in-flight", wo.max_groups_in_flight, "Leases held at once");
  app.add_option("--tls-ca", co.tls.root_ca_file, "CA of the trainer's certificate (TLS)");
  app.add_option("--tls-cert", co.tls.cert_file, "Client certificate (mutual TLS)");
  app.add_option("--tls-key", co.tls.key_file, "Client key (mutual TLS)");
  app.add_option("--timeout-ms", timeout_ms, "Deadline of each call to the trainer");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "relay-rollout: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  if (Status s = init_logging(log_level); !s.ok()) return fail(s);
  if (co.auth_token.empty() && std::getenv("RELAY_TOKEN") != nullptr) {
    co.auth_token = std::getenv("RELAY_TOKEN");
  }
  co.timeout_ms = timeout_ms;
  ra.prompts = 1;
  StatusOr<cli::RolloutSetup> setup = cli::setup_rollout(ra);
  if (!setup.ok()) return fail(setup.status());
  cli::RolloutSetup& s = *setup;
  StatusOr<std::unique_ptr<comm::TrainerClient>> client = comm::TrainerClient::connect(co);
  if (!client.ok()) return fail(client.status());
  comm::RolloutWorker worker(*std::move(client), s.policy, s.engine, s.task, s.tokenizer,
                             std::chrono::milliseconds(static_cast<int64_t>(
                                 std::ceil(s.config.task.verifier_timeout_s * 1000))),
                             wo);
  // The trainer may still be starting: retry registration for a while.
  Status started = worker.start();
  for (int i = 0;
       !started.ok() && started.code() == absl::StatusCode::kUnavailable && i < 100 && !g_stop;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    started = worker.start();
  }
  if (!started.ok()) return fail(started);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::printf("worker %s: running version %lld\n", worker.worker_id().c_str(),
              static_cast<long long>(worker.version()));
  std::fflush(stdout);
  Status result = worker.run([] { return g_stop.load(); });
  const comm::RolloutWorkerStats& st = worker.stats();
  std::printf(
      "worker %s: %lld groups submitted, %lld accepted, %lld refused, %lld versions applied\n",
      worker.worker_id().c_str(), static_cast<long long>(st.groups_submitted),
      static_cast<long long>(st.groups_accepted), static_cast<long long>(st.groups_refused),
      static_cast<long long>(st.versions_applied));
  // The trainer ending (its server shut down mid-call) is how a run ends.
  if (!result.ok() && (result.code() == absl::StatusCode::kUnavailable ||
                       result.code() == absl::StatusCode::kCancelled)) {
    std::printf("worker %s: the trainer is gone (%s); stopping\n", worker.worker_id().c_str(),
                std::string(result.message()).c_str());
    return 0;
  }
  if (!result.ok()) return fail(result);
  return 0;
}
