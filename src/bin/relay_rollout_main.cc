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
// open leases back, so their prompts are leased again at once.

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "relay/app/setup.h"
#include "relay/comm/rpc/grpc_trainer_client.h"
#include "relay/comm/worker/rollout_worker.h"
#include "relay/common/logging.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

}  // namespace

int main(int argc, char** argv) {
  relay::app::report_uncaught_exceptions("relay-rollout");
  using namespace relay;
  CLI::App app{"relay-rollout: a rollout worker for relay-trainer"};
  app::SetupArgs ra;
  comm::ClientOptions co;
  comm::RolloutWorkerOptions wo;
  std::string log_level = "warn", token_flag;
  std::optional<int64_t> groups_in_flight;
  int64_t reconnect_s = 60;
  app.add_option("config", ra.config_file, "YAML experiment config (the trainer's)")->required();
  app.add_option("overrides", ra.overrides, "key.path=value overrides");
  app.add_option("--model", ra.model_dir,
                 "Model directory for the architecture and tokenizer (default: model.path); "
                 "the weights come from the trainer");
  app.add_option("--trainer", co.address, "relay-trainer's gRPC address host:port")->required();
  app.add_option("--name", wo.name, "Worker name shown in the trainer's stats");
  app.add_option("--token", token_flag,
                 "Shared bearer token (default services.token_file, then $RELAY_TOKEN)");
  app.add_option("--groups-in-flight", groups_in_flight,
                 "Leases held at once (default rollout.groups_in_flight)");
  app.add_option("--reconnect-s", reconnect_s,
                 "How long to keep trying to reach the trainer (at start, or after it went away)");
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
  if (Status s = init_logging(log_level, "rollout " + wo.name); !s.ok()) return fail(s);
  if (groups_in_flight) {
    ra.overrides.push_back("rollout.groups_in_flight=" + std::to_string(*groups_in_flight));
  }
  StatusOr<app::RolloutSetup> setup = app::setup_rollout(ra);
  if (!setup.ok()) return fail(setup.status());
  app::RolloutSetup& s = *setup;
  const ServicesConfig& sv = s.config.services;
  StatusOr<std::string> token = app::auth_token(sv, token_flag);
  if (!token.ok()) return fail(token.status());
  co.auth_token = *token;
  co.timeout_ms = static_cast<int64_t>(std::ceil(sv.rpc_timeout_s * 1000));
  // With TLS on, the worker checks the trainer's certificate against tls.ca
  // and, for mutual TLS, presents tls.cert/key signed by the same CA.
  if (!sv.tls.cert.empty()) {
    co.tls.root_ca_file = sv.tls.ca;
    if (sv.tls.mutual) {
      co.tls.cert_file = sv.tls.cert;
      co.tls.key_file = sv.tls.key;
    }
  }
  wo.max_groups_in_flight = s.config.rollout.groups_in_flight;
  wo.weight_sync = sv.weight_sync;
  wo.weight_sync_timeout_ms = static_cast<int64_t>(std::ceil(sv.weight_sync_timeout_s * 1000));
  StatusOr<std::unique_ptr<comm::TrainerClient>> client = comm::GrpcTrainerClient::connect(co);
  if (!client.ok()) return fail(client.status());
  comm::RolloutWorker worker(*std::move(client), s.policy, s.engine, s.task, s.tokenizer,
                             std::chrono::milliseconds(static_cast<int64_t>(
                                 std::ceil(s.config.task.verifier_timeout_s * 1000))),
                             wo);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  auto run_finished = [](const Status& s) { return s.code() == absl::StatusCode::kOutOfRange; };
  auto trainer_gone = [](const Status& s) {
    return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled;
  };
  // Registers, retrying while the trainer is unreachable (still starting, or
  // restarting on its run directory; a call cut off by a server shutting
  // down is CANCELLED) for up to --reconnect-s.
  auto connect = [&]() -> Status {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(reconnect_s);
    Status started = worker.start();
    while (!started.ok() && trainer_gone(started) && !g_stop &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      started = worker.start();
    }
    return started;
  };
  Status result = connect();
  if (!result.ok()) {
    // Stopped (SIGTERM) before ever registering, or joining a run that has
    // already finished: nothing was leased, so nothing is lost.
    if (g_stop || run_finished(result)) {
      std::printf("worker %s: stopping before registering (%s)\n", wo.name.c_str(),
                  g_stop ? "signal" : "the run is finished");
      return 0;
    }
    return fail(result);
  }
  std::printf("worker %s: running version %lld\n", worker.worker_id().c_str(),
              static_cast<long long>(worker.version()));
  std::fflush(stdout);
  for (;;) {
    result = worker.run([] { return g_stop.load(); });
    if (result.ok() || g_stop || run_finished(result) || !trainer_gone(result)) break;
    std::printf("worker %s: the trainer is gone (%s); reconnecting for up to %lld s\n",
                worker.worker_id().c_str(), std::string(result.message()).c_str(),
                static_cast<long long>(reconnect_s));
    std::fflush(stdout);
    Status again = connect();
    if (!again.ok()) {
      if (!trainer_gone(again)) return fail(again);
      break;  // keeps `result`: the trainer went away and did not come back
    }
    std::printf("worker %s: reconnected, running version %lld\n", worker.worker_id().c_str(),
                static_cast<long long>(worker.version()));
    std::fflush(stdout);
  }
  if (result.ok() && g_stop) {
    StatusOr<int32_t> released = worker.drain();
    if (released.ok()) {
      std::printf("worker %s: stopping; gave back %d leases\n", worker.worker_id().c_str(),
                  *released);
    } else {
      std::printf("worker %s: stopping; could not give leases back (%s); they expire\n",
                  worker.worker_id().c_str(), std::string(released.status().message()).c_str());
    }
  }
  const comm::RolloutWorkerStats& st = worker.stats();
  std::printf(
      "worker %s: %lld groups submitted, %lld accepted, %lld refused, %lld versions applied "
      "(%lld by broadcast)\n",
      worker.worker_id().c_str(), static_cast<long long>(st.groups_submitted),
      static_cast<long long>(st.groups_accepted), static_cast<long long>(st.groups_refused),
      static_cast<long long>(st.versions_applied), static_cast<long long>(st.versions_broadcast));
  if (run_finished(result)) {
    std::printf("worker %s: the run is finished; stopping\n", worker.worker_id().c_str());
    return 0;
  }
  // The trainer going away for good also ends a worker cleanly.
  if (!result.ok() && trainer_gone(result)) {
    std::printf("worker %s: the trainer is gone (%s); stopping\n", worker.worker_id().c_str(),
                std::string(result.message()).c_str());
    return 0;
  }
  if (!result.ok()) return fail(result);
  return 0;
}
