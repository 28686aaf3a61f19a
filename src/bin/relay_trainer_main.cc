// relay-trainer: the learner process. Serves the worker and admin gRPC
// services over the rollout store and prompt dispenser, trains on groups as
// they arrive (within the staleness bound), and publishes each new version.
//
//   relay-trainer CONFIG [key=value ...] [--run-dir DIR] [--model DIR] [--store DIR]
//       [--listen ADDR] [--port-file F] [--steps N] [--groups-per-step G]
//       [--eval-prompts E] [--eval-every K] [--metrics-out F] [--save DIR] [--token T]
//       [--resume]
//
// Everything else comes from the config (experiment.*, services.*). The run
// directory (default <experiment.output_dir>/<experiment.name>) holds
// config.yaml, metrics.jsonl, checkpoints/ and store/. Started again on the
// same run directory, the trainer resumes from its newest checkpoint
// (checkpoints/step_NNNNNN/) and puts the rollout store and the prompt
// dispenser back where they stood when it was written, so the steps after it
// repeat what an uninterrupted run would do (docs/services.md).

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "relay/app/endpoint_sink.h"
#include "relay/app/run_directory.h"
#include "relay/app/evaluation.h"
#include "relay/app/setup.h"
#include "relay/app/warm_start.h"
#include "bin/trainer_ranks.h"
#include "relay/comm/metrics_endpoint.h"
#include "relay/comm/rpc.h"
#include "relay/comm/sample_records.h"
#include "relay/comm/trainer_host.h"
#include "relay/comm/trainer_ranks.h"
#include "relay/comm/trainer_service.h"
#include "relay/comm/weight_broadcaster.h"
#include "relay/common/file_io.h"
#include "relay/common/logging.h"
#include "relay/common/number_format.h"
#include "relay/common/progress.h"
#include "relay/common/metrics.h"
#include "relay/model/checkpoint.h"
#include "relay/store/dispenser.h"
#include "relay/trainer/options.h"
#include "relay/trainer/run_checkpoint.h"

namespace {

namespace fs = std::filesystem;
using namespace relay;

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

int fail(const Status& s) {
  std::fprintf(stderr, "relay-trainer: %s\n", std::string(s.message()).c_str());
  return 1;
}

int64_t ms(double seconds) { return static_cast<int64_t>(std::ceil(seconds * 1000)); }

// The trainer, resumed from the newest checkpoint under `root` when there is
// one, else freshly built over s.policy (after the warm start).
struct Resumed {
  std::unique_ptr<trainer::Trainer> trainer;
  int64_t rl_step = 0;
  int64_t rl_start_version = 0;
};

}  // namespace

int main(int argc, char** argv) {
  relay::app::report_uncaught_exceptions("relay-trainer");
  CLI::App app{"relay-trainer: the learner; serves rollout workers over gRPC"};
  app::SetupArgs ra;
  std::string run_dir, store_dir, listen, port_file, metrics_out, save, token_flag,
      log_level = "warn";
  std::optional<int64_t> steps, groups_per_step, eval_prompts, eval_every;
  bool resume = false;
  app.add_option("config", ra.config_file, "YAML experiment config")->required();
  app.add_option("overrides", ra.overrides, "key.path=value overrides");
  app.add_option("--run-dir", run_dir,
                 "Run directory (default <experiment.output_dir>/<experiment.name>)");
  app.add_option("--model", ra.model_dir, "Starting model directory (default: model.path)");
  app.add_option("--store", store_dir, "Rollout store directory (default <run dir>/store)");
  app.add_option("--listen", listen, "gRPC address (default services.listen)");
  app.add_option("--port-file", port_file, "Write the bound port here once serving");
  app.add_option("--steps", steps, "RL steps (default experiment.steps)");
  app.add_option("--groups-per-step", groups_per_step, "Groups per step (experiment.*)");
  app.add_option("--eval-prompts", eval_prompts, "Held-out prompts (eval.prompts)");
  app.add_option("--eval-every", eval_every, "Evaluate every N steps (eval.every)");
  app.add_option("--metrics-out", metrics_out, "Metrics JSONL (default <run dir>/metrics.jsonl)");
  app.add_option("--save", save, "Also write the trained model here");
  app.add_option("--token", token_flag,
                 "Shared bearer token (default services.token_file, then $RELAY_TOKEN)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  app.add_flag("--resume", resume,
               "Continue from the run directory's newest checkpoint (an error when it has none; "
               "without the flag a run directory with checkpoints is resumed too)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (Status s = init_logging(log_level, "trainer"); !s.ok()) return fail(s);
  // Flags are shorthands for experiment.* overrides, applied last.
  if (steps) ra.overrides.push_back(absl::StrCat("experiment.steps=", *steps));
  if (groups_per_step) {
    ra.overrides.push_back(absl::StrCat("experiment.groups_per_step=", *groups_per_step));
  }
  if (eval_prompts) ra.overrides.push_back(absl::StrCat("eval.prompts=", *eval_prompts));
  if (eval_every) ra.overrides.push_back(absl::StrCat("eval.every=", *eval_every));
  if (!listen.empty()) ra.overrides.push_back(absl::StrCat("services.listen=", listen));

  StatusOr<app::RolloutSetup> setup = app::setup_rollout(ra);
  if (!setup.ok()) return fail(setup.status());
  app::RolloutSetup& s = *setup;
  const ExperimentSection& ex = s.config.experiment;
  const ServicesConfig& sv = s.config.services;
  StatusOr<trainer::TrainerOptions> to = app::trainer_options(s);
  if (!to.ok()) return fail(to.status());

  // trainer.world_size > 1: every rank runs this program with the same
  // config. Rank 0 is the trainer below; the others make its trainer calls
  // on their shards of each batch and touch nothing else (no ports, no run
  // directory).
  StatusOr<comm::TrainerRank> place = cli::trainer_rank(s.config);
  if (!place.ok()) return fail(place.status());
  StatusOr<std::shared_ptr<trainer::Collectives>> group =
      cli::join_trainer_ranks(s.config, *place, s.policy->parameters().front().device().str());
  if (!group.ok()) return fail(group.status());
  if (place->rank > 0) return cli::run_follower_rank(s, *to, *place, *group);
  std::unique_ptr<comm::RankLeader> leader;
  if (*group) leader = std::make_unique<comm::RankLeader>(*group);
  // Every way out of main stops the other ranks (they would otherwise wait
  // for rank 0 until its store goes away).
  struct StopFollowers {
    comm::RankLeader* leader;
    ~StopFollowers() {
      if (leader == nullptr) return;
      if (Status st = leader->stop(); !st.ok()) {
        std::fprintf(stderr, "warning: stopping the other trainer ranks: %s\n",
                     std::string(st.message()).c_str());
      }
    }
  } stop_followers{leader.get()};
  const int64_t bucket_bytes = int64_t{s.config.trainer.data_parallel.allreduce_bucket_mb} << 20;
  auto data_parallel = [&] {
    return leader ? leader->data_parallel(bucket_bytes) : trainer::DataParallel{};
  };

  StatusOr<std::string> token = app::auth_token(sv, token_flag);
  if (!token.ok()) return fail(token.status());

  if (run_dir.empty()) run_dir = (fs::path(ex.output_dir) / ex.name).string();
  const app::RunLayout run = app::run_layout(run_dir, metrics_out, store_dir);
  metrics_out = run.metrics;
  store_dir = run.store;
  const std::string& checkpoints = run.checkpoints;
  StatusOr<app::ResumePoint> start = app::prepare_run_directory(run, to_yaml(s.config), resume);
  if (!start.ok()) return fail(start.status());
  const std::optional<trainer::CheckpointInfo>& latest = start->checkpoint;
  // samples.jsonl: a few responses of every RL step, for the dashboard.
  RunFiles run_data = run_files(run_dir);
  run_data.metrics = metrics_out;
  // Every record goes to metrics.jsonl, to TensorBoard event files and, when
  // the trainer serves one, to /metrics.
  FanOutMetricsSink metrics;
  StatusOr<std::unique_ptr<JsonlMetricsSink>> jsonl =
      JsonlMetricsSink::open(metrics_out, JsonlMetricsSink::Mode::kAppend);
  if (!jsonl.ok()) return fail(jsonl.status());
  metrics.add(*std::move(jsonl));
  StatusOr<std::unique_ptr<TensorBoardMetricsSink>> tensorboard =
      TensorBoardMetricsSink::open(run_dir + "/tensorboard");
  if (!tensorboard.ok()) return fail(tensorboard.status());
  metrics.add(*std::move(tensorboard));
  std::ofstream samples_out(run_data.samples, std::ios::app);
  if (!samples_out) {
    return fail(InternalError("cannot open " + run_data.samples + " for appending"));
  }
  std::unique_ptr<comm::MetricsEndpoint> endpoint;
  if (!sv.http_listen.empty()) {
    const size_t colon = sv.http_listen.rfind(':');
    StatusOr<std::unique_ptr<comm::MetricsEndpoint>> e = comm::MetricsEndpoint::start(
        sv.http_listen.substr(0, colon), std::atoi(sv.http_listen.c_str() + colon + 1), run_data);
    if (!e.ok()) return fail(e.status());
    endpoint = *std::move(e);
    metrics.add(std::make_unique<app::EndpointMetricsSink>(endpoint.get()));
    std::printf("metrics at http://%s:%d/metrics\n", sv.http_listen.substr(0, colon).c_str(),
                endpoint->port());
    std::printf("dashboard at http://%s:%d/\n", sv.http_listen.substr(0, colon).c_str(),
                endpoint->port());
  }

  const EvalConfig& ev = s.config.eval;
  app::PromptSplit split{s.task->size(), ev.prompts};
  if (split.size >= 0 && split.size - split.eval < 1) {
    return fail(InvalidArgumentError("eval.prompts: leaves no prompt to train on"));
  }
  StatusOr<model::SaveOptions> save_options = app::model_save_options(s);
  if (!save_options.ok()) return fail(save_options.status());
  rollout::SafeVerifier verifier(s.task,
                                 std::chrono::milliseconds(ms(s.config.task.verifier_timeout_s)));
  double last_accuracy = std::nan("");
  int64_t last_eval_step = -1;
  auto eval = [&](int64_t step, const std::string& label, const model::Policy& policy) -> Status {
    if (split.eval == 0) return OkStatus();
    app::EvalOptions eo;
    eo.n = ev.n;
    eo.temperature = ev.temperature;
    eo.progress = absl::StrCat("eval ", label);
    RELAY_ASSIGN_OR_RETURN(app::EvalResult r,
                           app::evaluate_held_out(s, policy, split, verifier, eo));
    std::string passes;
    for (const auto& [k, v] : r.pass_at_k) passes += absl::StrFormat("  pass@%d %.3f", k, v);
    std::printf("eval %s: accuracy %.3f on %lld held-out prompts%s\n", label.c_str(), r.accuracy,
                static_cast<long long>(r.prompts), passes.c_str());
    std::fflush(stdout);
    metrics.record("eval", step, r.metrics());
    last_accuracy = r.accuracy;
    last_eval_step = step;
    return OkStatus();
  };

  // The store opens first: a checkpoint records where it stood, and a
  // resumed run puts it back there.
  store::StoreOptions so;
  so.path = store_dir;
  StatusOr<std::unique_ptr<store::RolloutStore>> store = store::RolloutStore::open(so);
  if (!store.ok()) return fail(store.status());
  const trainer::CheckpointRetention retention{ex.keep_checkpoints, ex.keep_best_checkpoint};
  // Writes the checkpoint of step `rl_step` (with the eval accuracy when
  // that step was evaluated and the store's position now).
  auto write_checkpoint = [&](const trainer::Trainer& t, int64_t rl_step,
                              int64_t rl_start_version) -> StatusOr<trainer::CheckpointInfo> {
    RELAY_ASSIGN_OR_RETURN(store::StorePosition pos, (*store)->position());
    trainer::CheckpointInfo meta;
    meta.rl_step = rl_step;
    meta.rl_start_version = rl_start_version;
    meta.seed = s.config.run.seed;
    if (last_eval_step == rl_step && !std::isnan(last_accuracy)) meta.eval_accuracy = last_accuracy;
    meta.store_next_seq = pos.next_seq;
    meta.dispenser_state = pos.side_record;
    Progress progress(absl::StrCat("checkpoint ", trainer::checkpoint_dir_name(rl_step)), 1);
    StatusOr<trainer::CheckpointInfo> info =
        trainer::write_checkpoint(checkpoints, t, meta, *save_options, retention);
    if (info.ok()) progress.update(1);
    return info;
  };

  // The other ranks build the same RL trainer: rank 0's weights, reference
  // and trainer state (after a resume: the checkpoint's).
  auto start_followers = [&](const trainer::Trainer& t, const model::Policy& ref) -> Status {
    if (!leader) return OkStatus();
    RELAY_ASSIGN_OR_RETURN(std::string state, t.save_state());
    return leader->start("rl", *t.policy(), t.version(), ref, state);
  };
  // Resume, or warm-start and write checkpoint zero so that a restart never
  // repeats the warm start.
  Resumed r;
  double best_accuracy = std::nan("");
  const std::string reference_dir = checkpoints + "/reference";
  model::Policy reference{nullptr};
  if (to->needs_reference()) {
    const std::string dir = !s.config.trainer.reference.empty() ? s.config.trainer.reference
                            : latest                           ? reference_dir
                                                                : "";
    if (!dir.empty()) {
      StatusOr<model::Policy> ref =
          model::load_policy(dir, {s.policy->parameters()[0].scalar_type()});
      if (!ref.ok()) return fail(ref.status());
      reference = *ref;
    }
  }
  if (latest) {
    const trainer::CheckpointInfo& info = *latest;
    if (info.seed != s.config.run.seed) {
      std::printf("note: run.seed is %llu; the checkpoint was written with %llu\n",
                  static_cast<unsigned long long>(s.config.run.seed),
                  static_cast<unsigned long long>(info.seed));
    }
    model::LoadOptions lo;
    lo.dtype = s.policy->parameters()[0].scalar_type();
    StatusOr<model::Policy> policy = model::load_policy(info.dir, lo);
    if (!policy.ok()) return fail(policy.status());
    s.policy = *policy;
    StatusOr<std::unique_ptr<trainer::Trainer>> tr =
        trainer::Trainer::create(s.policy, *to, info.version, reference, data_parallel());
    if (!tr.ok()) return fail(tr.status());
    if (Status st = trainer::restore_checkpoint(info, **tr); !st.ok()) return fail(st);
    if (Status st = start_followers(**tr, reference); !st.ok()) return fail(st);
    r = {*std::move(tr), info.rl_step, info.rl_start_version};
    // The store goes back to where it stood at the checkpoint: groups that
    // arrived later came from weights that died with the previous process,
    // and groups trained on later are trained on again, so the resumed run
    // sees what an uninterrupted one would have.
    store::StorePosition pos;
    pos.next_seq = std::max<uint64_t>(1, info.store_next_seq);
    pos.side_record = info.dispenser_state;
    StatusOr<store::RewindStats> rw = (*store)->rewind(pos, info.version);
    if (!rw.ok()) return fail(rw.status());
    StatusOr<std::optional<trainer::CheckpointInfo>> best = trainer::best_checkpoint(checkpoints);
    if (!best.ok()) return fail(best.status());
    if (*best) best_accuracy = *(*best)->eval_accuracy;
    std::printf(
        "resumed from %s: version %lld, step %lld of %d (store rewound: %lld groups trained on "
        "again, %lld later arrivals dropped)\n",
        info.dir.c_str(), static_cast<long long>(info.version),
        static_cast<long long>(info.rl_step), ex.steps, static_cast<long long>(rw->restored),
        static_cast<long long>(rw->dropped));
  } else {
    if ((*store)->appended() > 0) {
      return fail(FailedPreconditionError(absl::StrCat(
          store_dir, " holds ", (*store)->appended(), " groups but ", checkpoints,
          " no checkpoint to go with them: use a new experiment.name or remove ", store_dir)));
    }
    if (Status st = eval(0, "before", s.policy); !st.ok()) return fail(st);
    int64_t version = 0;
    if (ex.warm_start.sft_steps > 0) {
      app::WarmStart ws{ex.warm_start.sft_steps, ex.warm_start.sft_lr, ex.warm_start.batch};
      if (leader) {
        if (Status st = leader->start("sft", *s.policy, version, nullptr, ""); !st.ok()) {
          return fail(st);
        }
      }
      Progress progress("warm start", ws.steps);
      StatusOr<int64_t> after = app::warm_start(
          s, *to, split, version, ws,
          [&](int64_t k, const trainer::StepMetrics& m) {
            metrics.record("sft", k, m);
            progress.update(k, absl::StrFormat("sft_loss %.4f", m.at("sft_loss")));
          },
          data_parallel());
      if (!after.ok()) return fail(after.status());
      progress.finish();
      version = *after;
      if (Status st = eval(0, "after warm start", s.policy); !st.ok()) return fail(st);
    }
    StatusOr<std::unique_ptr<trainer::Trainer>> tr =
        trainer::Trainer::create(s.policy, *to, version, reference, data_parallel());
    if (!tr.ok()) return fail(tr.status());
    if (Status st = start_followers(**tr, reference); !st.ok()) return fail(st);
    r = {*std::move(tr), 0, version};
    if (to->needs_reference() && s.config.trainer.reference.empty()) {
      // The KL reference is the policy RL starts from; a resumed run needs it.
      if (Status st = model::save_policy(*s.policy, reference_dir, *save_options); !st.ok()) {
        return fail(st);
      }
    }
    if (last_eval_step == 0) best_accuracy = last_accuracy;
    StatusOr<trainer::CheckpointInfo> c = write_checkpoint(*r.trainer, 0, version);
    if (!c.ok()) return fail(c.status());
  }
  trainer::Trainer& tr = *r.trainer;

  store::DispenserOptions dopt;
  dopt.groups_per_step = ex.groups_per_step;
  dopt.max_staleness = s.config.trainer.max_staleness;
  dopt.base_version = r.rl_start_version;
  dopt.k = s.config.rollout.n;
  dopt.lease_timeout_ms = ms(sv.lease_timeout_s);
  dopt.num_prompts = split.size >= 0 ? split.size - split.eval : -1;
  StatusOr<std::unique_ptr<store::PromptDispenser>> dispenser =
      store::PromptDispenser::open(store->get(), dopt);
  if (!dispenser.ok()) return fail(dispenser.status());
  // Leases restored from the store belong to worker registrations of the
  // previous process, which no worker can submit under any more (workers
  // register again): their prompts go back in the queue now instead of
  // holding the staleness capacity until their deadlines. A prompt's
  // samples depend on its position in the stream, not on the lease, so it
  // samples the same again.
  int64_t orphaned = 0;
  for (const store::Lease& l : (*dispenser)->leases()) {
    if (Status st = (*dispenser)->release(l.id); !st.ok()) return fail(st);
    ++orphaned;
  }
  if (orphaned > 0) {
    std::printf("re-queued %lld prompts leased before the restart\n",
                static_cast<long long>(orphaned));
  }

  // One host copy of the weights, not two: a worker still downloading (or
  // a broadcast still sending) the previous version holds that snapshot
  // until it is done, and a worker that asks for a version no longer kept
  // takes the newer one. For a 0.5B-parameter fp32 model that is 2 GB less.
  comm::WeightPublisher publisher(/*keep=*/1);
  // What a group must satisfy to be trained on under this run's settings:
  // checked when it arrives and again when the trainer takes it.
  comm::SubmissionLimits limits;
  limits.vocab_size = s.policy->config().vocab_size;
  limits.moe_layers = s.policy->config().num_moe_layers();
  limits.moe_top_k = s.policy->config().num_experts_per_tok;
  limits.num_experts = s.policy->config().num_experts;
  limits.max_context = s.policy->config().max_position_embeddings;
  limits.max_response_tokens = s.config.rollout.max_new_tokens;
  limits.require_behavior_logprobs = !s.config.trainer.allow_missing_logprobs;
  comm::TrainerHostOptions ho;
  ho.limits = limits;
  ho.groups_per_step = ex.groups_per_step;
  ho.max_staleness = s.config.trainer.max_staleness;
  ho.group_wait_ms = ms(sv.group_wait_s);
  comm::TrainerHost host(&tr, store->get(), &publisher, ho);
  if (Status st = host.publish_current(); !st.ok()) return fail(st);

  // services.weight_sync broadcast | auto: the trainer hosts the c10d group's
  // store next to its gRPC port and broadcasts each version from a thread.
  std::unique_ptr<comm::WeightBroadcaster> broadcaster;
  if (sv.weight_sync != "fetch") {
    comm::WeightSyncServerOptions wo;
    wo.host = sv.listen.substr(0, sv.listen.rfind(':'));
    if (wo.host == "0.0.0.0" || wo.host == "[::]" || wo.host.empty()) {
      // Workers need an address to reach, not a wildcard.
      char name[256] = {};
      wo.host = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "127.0.0.1";
    }
    wo.port = sv.weight_sync_port;
    wo.bucket_bytes = int64_t{sv.weight_sync_bucket_mb} << 20;
    wo.timeout = std::chrono::milliseconds(ms(sv.weight_sync_timeout_s));
    wo.device = s.policy->parameters().front().device().str();
    StatusOr<std::unique_ptr<comm::WeightBroadcaster>> b =
        comm::WeightBroadcaster::start(&publisher, wo);
    if (!b.ok()) return fail(b.status());
    broadcaster = *std::move(b);
  }

  comm::TrainerServiceOptions sopt;
  sopt.auth_token = *token;
  sopt.worker_timeout_ms = ms(sv.worker_timeout_s);
  // Heartbeats come at least four times per liveness timeout.
  if (sopt.worker_timeout_ms > 0) {
    sopt.heartbeat_interval_ms =
        std::max<int64_t>(100, std::min<int64_t>(2000, sopt.worker_timeout_ms / 4));
  }
  if (broadcaster) sopt.weight_sync_endpoint = broadcaster->endpoint();
  sopt.max_staleness = s.config.trainer.max_staleness;
  sopt.greedy_baseline =
      s.config.trainer.advantage.estimator == trainer::AdvantageEstimator::kRemax;
  sopt.limits = limits;
  comm::TrainerService service(
      sopt, store->get(), dispenser->get(), &publisher,
      // A lease's group id and sampling seed are functions of its position in
      // the prompt stream (occurrence) only, not of the lease attempt: a
      // prompt leased again (expired, released, or re-queued by a restart)
      // samples exactly what it would have the first time under the same
      // weights, which is what makes a resumed run repeat an uninterrupted
      // one. The epoch is in the id, so a finite task's prompts are new
      // groups on every pass (and with fewer prompts than leases in flight,
      // one prompt may be in flight several times at once).
      [&](const store::Lease& lease) -> StatusOr<comm::PromptContent> {
        RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt p,
                               s.task->prompt(split.train_index(lease.prompt_index)));
        const int64_t epoch = dopt.num_prompts > 0 ? lease.occurrence / dopt.num_prompts : 0;
        RELAY_ASSIGN_OR_RETURN(
            rollout::PromptGroup g,
            app::prompt_group(s, p, absl::StrCat(p.id, "#", lease.occurrence, "@e", epoch),
                              rollout::sequence_seed(s.config.run.seed,
                                                     static_cast<uint64_t>(lease.occurrence))));
        comm::PromptContent c;
        c.group_id = g.group_id;
        c.prompt_tokens = std::move(g.prompt);
        c.target_tokens = std::move(g.target);
        c.seed = g.seed;
        return c;
      },
      [&host] { return host.version(); });
  comm::ServerOptions server_options;
  server_options.address = sv.listen;
  server_options.tls.cert_file = sv.tls.cert;
  server_options.tls.key_file = sv.tls.key;
  if (sv.tls.mutual) server_options.tls.client_ca_file = sv.tls.ca;
  StatusOr<std::unique_ptr<comm::RpcServer>> server =
      comm::RpcServer::start(server_options, {service.worker_service(), service.admin_service()});
  if (!server.ok()) return fail(server.status());
  if (!port_file.empty()) {
    if (Status st = write_file_atomic(port_file, std::to_string((*server)->port()) + "\n");
        !st.ok()) {
      return fail(st);
    }
  }
  std::printf("serving on port %d; run directory %s; version %lld\n", (*server)->port(),
              run_dir.c_str(), static_cast<long long>(tr.version()));
  std::fflush(stdout);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  auto checkpoint = [&]() -> Status {
    RELAY_ASSIGN_OR_RETURN(trainer::CheckpointInfo info,
                           write_checkpoint(tr, r.rl_step, r.rl_start_version));
    // Compaction must keep what a rewind to this checkpoint needs.
    host.set_compact_floor(info.version);
    return OkStatus();
  };
  host.set_compact_floor(tr.version());
  // Workers that registered and then all went silent (killed, out of
  // memory) fail the wait for groups after 2 x services.worker_timeout_s,
  // not services.group_wait_s.
  bool workers_gone = false;
  auto workers_present = [&]() -> Status {
    Status st = service.check_workers_present();
    workers_gone = !st.ok();
    return st;
  };
  const auto t0 = std::chrono::steady_clock::now();
  Status result = OkStatus();
  while (r.rl_step < ex.steps && !g_stop) {
    const auto step_start = std::chrono::steady_clock::now();
    StatusOr<trainer::StepMetrics> m = host.step([] { return g_stop.load(); }, workers_present);
    if (!m.ok()) {
      // SIGTERM while waiting for groups is a clean stop, not a failure.
      if (!(g_stop && m.status().code() == absl::StatusCode::kCancelled)) result = m.status();
      break;
    }
    ++r.rl_step;
    const auto now = std::chrono::steady_clock::now();
    const double step_s = std::chrono::duration<double>(now - step_start).count();
    (*m)["time/elapsed_s"] = std::chrono::duration<double>(now - t0).count();
    (*m)["time/step_s"] = step_s;
    (*m)["throughput/samples_per_s"] = step_s > 0 ? m->at("batch/trajectories") / step_s : 0.0;
    if (broadcaster) {
      const comm::WeightBroadcasterStats bs = broadcaster->stats();
      (*m)["weight_sync/members"] = bs.members;
      (*m)["weight_sync/broadcast_s"] = bs.last_seconds;
      (*m)["weight_sync/gbps"] = bs.last_gbps;
      (*m)["weight_sync/failures"] = static_cast<double>(bs.failures);
    }
    metrics.record("rl", r.rl_step, *m);
    samples_out << samples_jsonl_line(r.rl_step, tr.version(),
                                      comm::sample_records(host.last_groups(), *s.tokenizer, 4))
                << "\n"
                << std::flush;
    if (!samples_out) spdlog::warn("cannot append to {}", run_data.samples);
    bool new_best = false;
    if (ev.every > 0 && r.rl_step % ev.every == 0 && r.rl_step < ex.steps) {
      if (Status st = eval(r.rl_step, absl::StrCat("at step ", r.rl_step), tr.policy()); !st.ok()) {
        result = st;
        break;
      }
      new_best = std::isnan(best_accuracy) || last_accuracy > best_accuracy;
      if (new_best) best_accuracy = last_accuracy;
    }
    // One progress line per step.
    std::printf(
        "step %lld/%d  v%lld  reward %.3f  accuracy %s  staleness %.2f (max %.0f)  %s samples/s"
        "  waited %.2fs  mismatch %.1e\n",
        static_cast<long long>(r.rl_step), ex.steps, static_cast<long long>(tr.version()),
        m->at("reward/mean"),
        std::isnan(last_accuracy) ? "-" : absl::StrFormat("%.3f", last_accuracy).c_str(),
        m->at("staleness/mean"), m->at("staleness/max"),
        format_significant(m->at("throughput/samples_per_s")).c_str(), m->at("store/wait_s"),
        m->at("mismatch/k3"));
    std::fflush(stdout);
    // Periodic checkpoints, and the step of a new best eval accuracy (so
    // that the best model is kept).
    const bool periodic = ex.checkpoint_every > 0 && r.rl_step % ex.checkpoint_every == 0;
    if ((periodic || (new_best && ex.keep_best_checkpoint)) && r.rl_step < ex.steps) {
      if (Status st = checkpoint(); !st.ok()) {
        result = st;
        break;
      }
    }
  }
  const bool finished = result.ok() && r.rl_step >= ex.steps;
  if (finished) result = eval(r.rl_step, "after", tr.policy());
  // Stop serving before the final write. After a finished run, workers are
  // told so on their next call (they exit rather than wait for a restart):
  // keep serving until each has made one, for at most 10 s.
  if (finished) {
    service.finish();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!service.all_workers_told() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  (*server)->shutdown(2000);
  if (result.ok() || g_stop || workers_gone) {
    // A drained stop (SIGTERM) checkpoints too, so a restart loses nothing;
    // so does giving up on the workers (the trainer itself is fine).
    if (Status st = checkpoint(); !st.ok() && result.ok()) result = st;
  }
  if (result.ok() && finished && !save.empty()) {
    result = model::save_policy(*tr.policy(), save, *save_options);
  }
  const store::DispenserStats ds = (*dispenser)->stats();
  std::printf(
      "dispenser: %lld groups accepted in all, %lld leases expired, %lld released, %lld late "
      "submissions rejected, %lld leases open\n",
      static_cast<long long>(ds.accepted), static_cast<long long>(ds.expired_leases),
      static_cast<long long>(ds.released), static_cast<long long>(ds.rejected_late),
      static_cast<long long>(ds.in_flight));
  if (leader) {
    if (Status st = leader->stop(); !st.ok() && result.ok()) result = st;
    cli::print_weights_digest(*tr.policy(), 0);
  }
  if (!result.ok()) return fail(result);
  std::printf("%s: version %lld, step %lld of %d\n", finished ? "done" : "stopped",
              static_cast<long long>(host.version()), static_cast<long long>(r.rl_step), ex.steps);
  return 0;
}
