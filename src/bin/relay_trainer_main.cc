// relay-trainer: the learner process. Serves the worker and admin gRPC
// services over the rollout store and prompt dispenser, trains on groups as
// they arrive (within the staleness bound), and publishes each new version.
//
//   relay-trainer CONFIG [key=value ...] --store DIR [--model DIR] [--listen ADDR]
//       [--port-file F] [--steps N] [--groups-per-step G] [--eval-prompts E]
//       [--eval-every K] [--metrics-out F] [--save DIR] [--token T]
//       [--tls-cert F --tls-key F [--tls-client-ca F]]

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bin/setup.h"
#include "relay/comm/rpc.h"
#include "relay/comm/trainer_host.h"
#include "relay/comm/trainer_service.h"
#include "relay/common/file_io.h"
#include "relay/common/logging.h"
#include "relay/model/checkpoint.h"
#include "relay/store/dispenser.h"
#include "relay/trainer/options.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

int fail(const relay::Status& s) {
  std::fprintf(stderr, "relay-trainer: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace relay;
  CLI::App app{"relay-trainer: the learner; serves rollout workers over gRPC"};
  cli::RolloutArgs ra;
  std::string store_dir, listen = "127.0.0.1:0", port_file, metrics_out, save, token,
                         log_level = "warn";
  comm::TlsOptions tls;
  int64_t steps = 10, groups_per_step = 8, eval_prompts = 0, eval_every = 0,
          lease_timeout_ms = 600000;
  int64_t group_wait_ms = 600000;
  app.add_option("config", ra.config_file, "YAML experiment config")->required();
  app.add_option("overrides", ra.overrides, "key.path=value overrides");
  app.add_option("--model", ra.model_dir, "Starting model directory (default: model.path)");
  app.add_option("--store", store_dir, "Rollout store directory (created when missing)")
      ->required();
  app.add_option("--listen", listen, "gRPC address (port 0 = any free port)");
  app.add_option("--port-file", port_file, "Write the bound port here once serving");
  app.add_option("--steps", steps, "Optimizer steps to run");
  app.add_option("--groups-per-step", groups_per_step, "Prompt groups per step");
  app.add_option("--eval-prompts", eval_prompts, "Held-out prompts for greedy accuracy");
  app.add_option("--eval-every", eval_every, "Evaluate every N steps (0 = ends only)");
  app.add_option("--metrics-out", metrics_out, "Write each step's metrics as JSONL here");
  app.add_option("--save", save, "Write the trained model here");
  app.add_option("--token", token, "Shared bearer token workers must send (default: $RELAY_TOKEN)");
  app.add_option("--tls-cert", tls.cert_file, "Serve TLS with this certificate chain (PEM)");
  app.add_option("--tls-key", tls.key_file, "... and this private key");
  app.add_option("--tls-client-ca", tls.client_ca_file, "Require client certificates from this CA");
  app.add_option("--lease-timeout-ms", lease_timeout_ms, "Lease deadline");
  app.add_option("--group-wait-ms", group_wait_ms, "Give up when no full batch arrives this long");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (Status s = init_logging(log_level); !s.ok()) return fail(s);
  if (token.empty() && std::getenv("RELAY_TOKEN") != nullptr) token = std::getenv("RELAY_TOKEN");
  if (steps < 0 || groups_per_step < 1 || eval_prompts < 0) {
    return fail(
        InvalidArgumentError("--steps and --eval-prompts must be >= 0, --groups-per-step >= 1"));
  }

  ra.prompts = 1;
  StatusOr<cli::RolloutSetup> setup = cli::setup_rollout(ra);
  if (!setup.ok()) return fail(setup.status());
  cli::RolloutSetup& s = *setup;
  cli::PromptSplit split{s.task->size(), eval_prompts};
  if (split.size >= 0 && split.size - split.eval < 1) {
    return fail(InvalidArgumentError("--eval-prompts: leaves no prompt to train on"));
  }
  StatusOr<trainer::TrainerOptions> to = trainer::trainer_options(s.config);
  if (!to.ok()) return fail(to.status());
  to->pad_token_id = std::max<int64_t>(0, s.tokenizer->pad_id());
  StatusOr<std::unique_ptr<trainer::Trainer>> tr = trainer::Trainer::create(s.policy, *to, 0);
  if (!tr.ok()) return fail(tr.status());

  store::StoreOptions so;
  so.path = store_dir;
  StatusOr<std::unique_ptr<store::RolloutStore>> store = store::RolloutStore::open(so);
  if (!store.ok()) return fail(store.status());
  store::DispenserOptions dopt;
  dopt.groups_per_step = groups_per_step;
  dopt.max_staleness = s.config.trainer.max_staleness;
  dopt.k = s.config.rollout.n;
  dopt.lease_timeout_ms = lease_timeout_ms;
  dopt.num_prompts = split.size >= 0 ? split.size - split.eval : -1;
  StatusOr<std::unique_ptr<store::PromptDispenser>> dispenser =
      store::PromptDispenser::open(store->get(), dopt);
  if (!dispenser.ok()) return fail(dispenser.status());

  comm::WeightPublisher publisher;
  comm::TrainerHostOptions ho;
  ho.groups_per_step = groups_per_step;
  ho.max_staleness = s.config.trainer.max_staleness;
  ho.group_wait_ms = group_wait_ms;
  comm::TrainerHost host(tr->get(), store->get(), &publisher, ho);
  if (Status st = host.publish_current(); !st.ok()) return fail(st);

  comm::TrainerServiceOptions sopt;
  sopt.auth_token = token;
  sopt.max_staleness = s.config.trainer.max_staleness;
  sopt.greedy_baseline = s.config.trainer.advantage.estimator == "remax";
  sopt.limits.vocab_size = s.policy->config().vocab_size;
  comm::TrainerService service(
      sopt, store->get(), dispenser->get(), &publisher,
      [&](int64_t index, int attempt) -> StatusOr<comm::PromptContent> {
        RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt p, s.task->prompt(split.train_index(index)));
        RELAY_ASSIGN_OR_RETURN(
            rollout::PromptGroup g,
            cli::prompt_group(
                s, p, absl::StrCat(p.id, "#", index),
                rollout::sequence_seed(s.config.run.seed,
                                       static_cast<uint64_t>(index) * 1000003 + attempt)));
        comm::PromptContent c;
        c.group_id = g.group_id;
        c.prompt_tokens = std::move(g.prompt);
        c.target_tokens = std::move(g.target);
        c.seed = g.seed;
        return c;
      },
      [&host] { return host.version(); });
  comm::ServerOptions server_options;
  server_options.address = listen;
  server_options.tls = tls;
  StatusOr<std::unique_ptr<comm::RpcServer>> server =
      comm::RpcServer::start(server_options, {service.worker_service(), service.admin_service()});
  if (!server.ok()) return fail(server.status());
  if (!port_file.empty()) {
    if (Status st = write_file_atomic(port_file, std::to_string((*server)->port()) + "\n");
        !st.ok()) {
      return fail(st);
    }
  }
  std::printf("serving on port %d; store %s\n", (*server)->port(), store_dir.c_str());
  std::fflush(stdout);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  rollout::SafeVerifier verifier(s.task, std::chrono::milliseconds(static_cast<int64_t>(
                                             std::ceil(s.config.task.verifier_timeout_s * 1000))));
  std::string metrics_lines;
  auto record = [&](const std::string& phase, int64_t step, const trainer::StepMetrics& m) {
    nlohmann::json j = {{"phase", phase}, {"step", step}};
    for (const auto& [k, v] : m) j[k] = v;
    absl::StrAppend(&metrics_lines, j.dump(), "\n");
  };
  auto eval = [&](int64_t step, const char* label) -> Status {
    if (split.eval == 0) return OkStatus();
    RELAY_ASSIGN_OR_RETURN(double acc, cli::evaluate(s, (*tr)->policy(), split, verifier));
    std::printf("eval %s: accuracy %.3f\n", label, acc);
    record("eval", step, {{"accuracy", acc}});
    return OkStatus();
  };
  if (Status st = eval(0, "before"); !st.ok()) return fail(st);
  const auto t0 = std::chrono::steady_clock::now();
  Status result = OkStatus();
  for (int64_t step = 0; step < steps && !g_stop; ++step) {
    StatusOr<trainer::StepMetrics> m = host.step([] { return g_stop.load(); });
    if (!m.ok()) {
      result = m.status();
      break;
    }
    (*m)["time/elapsed_s"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "step %lld: reward/mean=%.4g staleness/mean=%.3g store/wait_s=%.3g mismatch/k3=%.3g\n",
        static_cast<long long>(step + 1), m->at("reward/mean"), m->at("staleness/mean"),
        m->at("store/wait_s"), m->at("mismatch/k3"));
    std::fflush(stdout);
    record("rl", step + 1, *m);
    if (eval_every > 0 && (step + 1) % eval_every == 0 && step + 1 < steps) {
      if (Status st = eval(step + 1, absl::StrCat("at step ", step + 1).c_str()); !st.ok()) {
        result = st;
        break;
      }
    }
  }
  if (result.ok()) result = eval(steps, "after");
  (*server)->shutdown(2000);
  if (!metrics_out.empty()) {
    if (Status st = write_file_atomic(metrics_out, metrics_lines); !st.ok() && result.ok())
      result = st;
  }
  if (result.ok() && !save.empty()) {
    model::SaveOptions save_options;
    save_options.overwrite = true;
    if (auto* ct = dynamic_cast<const model::CharTokenizer*>(s.tokenizer.get())) {
      save_options.extra_files[model::kCharTokenizerFile] = ct->to_json();
    }
    result = model::save_policy(*(*tr)->policy(), save, save_options);
  }
  if (!result.ok()) return fail(result);
  std::printf("done: version %lld\n", static_cast<long long>(host.version()));
  return 0;
}
