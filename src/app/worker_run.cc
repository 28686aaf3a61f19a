// relay-rollout's run (app/worker_run.h).

#include "relay/app/worker_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "relay/comm/rpc/grpc_trainer_client.h"
#include "relay/comm/worker/rollout_worker.h"

namespace relay::app {
namespace {

int fail(const Status& s) {
  std::fprintf(stderr, "relay-rollout: %s\n", std::string(s.message()).c_str());
  return 1;
}

bool run_finished(const Status& s) { return s.code() == absl::StatusCode::kOutOfRange; }

// Unreachable, or a call cut off by a server shutting down (CANCELLED).
bool trainer_gone(const Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled;
}

// The gRPC client's options from services.*: the token, the deadline, and
// with TLS on, the CA that signs the trainer's certificate (and for mutual
// TLS, this worker's own certificate signed by the same CA).
StatusOr<comm::ClientOptions> client_options(const WorkerRunArgs& args, const ServicesConfig& sv) {
  comm::ClientOptions co;
  co.address = args.trainer_address;
  RELAY_ASSIGN_OR_RETURN(co.auth_token, auth_token(sv, args.token));
  co.timeout_ms = static_cast<int64_t>(std::ceil(sv.rpc_timeout_s * 1000));
  if (!sv.tls.cert.empty()) {
    co.tls.root_ca_file = sv.tls.ca;
    if (sv.tls.mutual) {
      co.tls.cert_file = sv.tls.cert;
      co.tls.key_file = sv.tls.key;
    }
  }
  return co;
}

// rollout.agent.listen: the worker's endpoint for agents, set up as relay
// serve's; nullopt when agents are off.
StatusOr<std::optional<comm::RolloutWorkerOptions::Agents>> agent_options(const WorkerRunArgs& args,
                                                                          const RolloutSetup& s) {
  const AgentConfig& a = s.config.rollout.agent;
  if (a.listen.empty()) return std::nullopt;
  if (s.chat_template == model::ChatTemplate::kNone) {
    return InvalidArgumentError(
        "rollout.agent.listen: agents send chat messages, which need the model's chat template "
        "(model.chat_template)");
  }
  comm::RolloutWorkerOptions::Agents ag;
  const size_t colon = a.listen.rfind(':');  // the config checked host:port
  ag.serve.host = a.listen.substr(0, colon);
  ag.serve.port = std::stoi(a.listen.substr(colon + 1));
  ag.serve.model_name = s.config.experiment.name;
  RELAY_ASSIGN_OR_RETURN(ag.serve.token, auth_token(s.config.services, args.token));
  // A turn's tokens default to the run's rollout.max_new_tokens.
  ag.serve.default_max_tokens = s.engine.max_new_tokens;
  ag.serve.max_requests = std::max(64, s.config.rollout.groups_in_flight * s.config.rollout.n);
  // What the trainer accepts of an episode (rollout.episode).
  ag.serve.episode_limits = serve::ServeOptions::EpisodeLimits{
      s.engine.episode.max_turns, s.engine.response_budget(/*episode=*/true)};
  ag.model = served_model(s);
  ag.episodes.system_prompt = s.config.model.system_prompt;
  ag.episodes.episode_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(std::ceil(a.episode_timeout_s * 1000)));
  return ag;
}

StatusOr<std::unique_ptr<comm::RolloutWorker>> make_worker(const WorkerRunArgs& args,
                                                           RolloutSetup& s) {
  const ServicesConfig& sv = s.config.services;
  RELAY_ASSIGN_OR_RETURN(comm::ClientOptions co, client_options(args, sv));
  comm::RolloutWorkerOptions wo;
  wo.name = args.name;
  wo.max_groups_in_flight = s.config.rollout.groups_in_flight;
  wo.weight_sync = sv.weight_sync;
  wo.weight_sync_timeout_ms = static_cast<int64_t>(std::ceil(sv.weight_sync_timeout_s * 1000));
  RELAY_ASSIGN_OR_RETURN(wo.agents, agent_options(args, s));
  if (!s.config.rollout.agent.command.empty() && !args.start_agent) {
    return InvalidArgumentError(
        "rollout.agent.command: this program does not start agents; relay-rollout does");
  }
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<rollout::Teacher> teacher, load_teacher(s));
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<comm::TrainerClient> client,
                         comm::GrpcTrainerClient::connect(co));
  auto worker = std::make_unique<comm::RolloutWorker>(
      std::move(client), s.policy, s.engine, s.task, s.tokenizer,
      std::chrono::milliseconds(
          static_cast<int64_t>(std::ceil(s.config.task.verifier_timeout_s * 1000))),
      // With agents, task.environment serves only the trainer's own episodes.
      wo, wo.agents ? nullptr : s.environment, episode_driver_options(s));
  worker->set_teacher(std::move(teacher));
  return worker;
}

// Registers, retrying while the trainer is unreachable (still starting, or
// restarting on its run directory) for up to `reconnect_s`. Registration is
// a call on another process: there is no event to wait on, so it retries
// every 200 ms.
Status register_with_retry(comm::RolloutWorker& worker, int64_t reconnect_s,
                           const std::function<bool()>& stop) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(reconnect_s);
  Status started = worker.start();
  while (!started.ok() && trainer_gone(started) && !stop() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    started = worker.start();
  }
  return started;
}

// Runs the worker, reconnecting when the trainer goes away mid-run; the
// status the run ended with (OK when `stop` ended it).
Status serve(comm::RolloutWorker& worker, int64_t reconnect_s, const std::function<bool()>& stop) {
  for (;;) {
    Status result = worker.run(stop);
    if (result.ok() || stop() || run_finished(result) || !trainer_gone(result)) return result;
    std::printf("worker %s: the trainer is gone (%s); reconnecting for up to %lld s\n",
                worker.worker_id().c_str(), std::string(result.message()).c_str(),
                static_cast<long long>(reconnect_s));
    std::fflush(stdout);
    Status again = register_with_retry(worker, reconnect_s, stop);
    if (!again.ok()) {
      // The trainer went away and did not come back: keep why it went.
      return trainer_gone(again) ? result : again;
    }
    std::printf("worker %s: reconnected, running version %lld\n", worker.worker_id().c_str(),
                static_cast<long long>(worker.version()));
    std::fflush(stdout);
  }
}

// Gives the open leases back (their prompts are leased again at once), then
// the totals and how the run ended; the exit code.
int finish(comm::RolloutWorker& worker, const Status& result, bool stopped) {
  const std::string& id = worker.worker_id();
  if (result.ok() && stopped) {
    StatusOr<int32_t> released = worker.drain();
    if (released.ok()) {
      std::printf("worker %s: stopping; gave back %d leases\n", id.c_str(), *released);
    } else {
      std::printf("worker %s: stopping; could not give leases back (%s); they expire\n", id.c_str(),
                  std::string(released.status().message()).c_str());
    }
  }
  const comm::RolloutWorkerStats& st = worker.stats();
  std::printf(
      "worker %s: %lld groups submitted, %lld accepted, %lld refused, %lld versions applied "
      "(%lld by broadcast)%s\n",
      id.c_str(), static_cast<long long>(st.groups_submitted),
      static_cast<long long>(st.groups_accepted), static_cast<long long>(st.groups_refused),
      static_cast<long long>(st.versions_applied), static_cast<long long>(st.versions_broadcast),
      !worker.serves_agents()
          ? ""
          : absl::StrCat(", ", st.agent_groups_dropped, " agent groups dropped").c_str());
  if (const rollout::Teacher* t = worker.teacher()) {
    const rollout::TeacherStats& ts = t->stats();
    std::printf("worker %s: the teacher scored %lld responses (%lld tokens) in %.1f s\n",
                id.c_str(), static_cast<long long>(ts.responses), static_cast<long long>(ts.tokens),
                ts.seconds);
  }
  if (run_finished(result)) {
    std::printf("worker %s: the run is finished; stopping\n", id.c_str());
    return 0;
  }
  // The trainer going away for good also ends a worker cleanly.
  if (!result.ok() && trainer_gone(result)) {
    std::printf("worker %s: the trainer is gone (%s); stopping\n", id.c_str(),
                std::string(result.message()).c_str());
    return 0;
  }
  return result.ok() ? 0 : fail(result);
}

}  // namespace

int run_worker(const WorkerRunArgs& args, const std::function<void()>& on_ready,
               const std::function<bool()>& stop) {
  SetupArgs sa = args.setup;
  if (args.groups_in_flight) {
    sa.overrides.push_back(absl::StrCat("rollout.groups_in_flight=", *args.groups_in_flight));
  }
  StatusOr<RolloutSetup> setup = setup_rollout(sa);
  if (!setup.ok()) return fail(setup.status());
  StatusOr<std::unique_ptr<comm::RolloutWorker>> worker = make_worker(args, *setup);
  if (!worker.ok()) return fail(worker.status());
  on_ready();
  Status started = register_with_retry(**worker, args.reconnect_s, stop);
  if (!started.ok()) {
    // Stopped (SIGTERM) before ever registering, or joining a run that has
    // already finished: nothing was leased, so nothing is lost.
    if (stop() || run_finished(started)) {
      std::printf("worker %s: stopping before registering (%s)\n", args.name.c_str(),
                  stop() ? "signal" : "the run is finished");
      return 0;
    }
    return fail(started);
  }
  std::printf("worker %s: running version %lld\n", (*worker)->worker_id().c_str(),
              static_cast<long long>((*worker)->version()));
  if (const std::string url = (*worker)->agent_url(); !url.empty()) {
    std::printf("worker %s: agents play episodes through %s\n", (*worker)->worker_id().c_str(),
                url.c_str());
    const std::vector<std::string>& command = setup->config.rollout.agent.command;
    if (!command.empty()) {
      StatusOr<std::string> token = auth_token(setup->config.services, args.token);
      if (!token.ok()) return fail(token.status());
      Status s = args.start_agent(
          command, {absl::StrCat("OPENAI_BASE_URL=", url),
                    absl::StrCat("OPENAI_API_KEY=", token->empty() ? "relay" : *token),
                    absl::StrCat("RELAY_MODEL=", setup->config.experiment.name)});
      if (!s.ok()) {
        (void)(*worker)->drain();
        return fail(s);
      }
    }
  }
  std::fflush(stdout);
  const Status result = serve(**worker, args.reconnect_s, stop);
  return finish(**worker, result, stop());
}

}  // namespace relay::app
