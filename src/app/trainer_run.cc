#include "relay/app/trainer_run.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "app/trainer_context.h"
#include "relay/app/endpoint_sink.h"
#include "relay/app/store_source.h"
#include "relay/app/trainer_ranks.h"
#include "relay/comm/host/sample_records.h"
#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/common/dashboard.h"
#include "relay/common/file_io.h"
#include "relay/common/number_format.h"
#include "relay/model/checkpoint.h"
#include "relay/model/lora.h"
#include "relay/store/dispenser.h"

namespace relay::app {
namespace {

using internal::TrainerContext;

int64_t ms(double seconds) { return static_cast<int64_t>(std::ceil(seconds * 1000)); }

int fail(const Status& s) {
  std::fprintf(stderr, "relay-trainer: %s\n", std::string(s.message()).c_str());
  return 1;
}

// Every record goes to metrics.jsonl, to TensorBoard event files and, with
// services.http_listen, to the /metrics endpoint (which serves the
// dashboard too).
Status open_metrics(TrainerContext& c) {
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<JsonlMetricsSink> jsonl,
                         JsonlMetricsSink::open(c.run.metrics, JsonlMetricsSink::Mode::kAppend));
  c.metrics.add(std::move(jsonl));
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<TensorBoardMetricsSink> tensorboard,
                         TensorBoardMetricsSink::open(c.run.tensorboard));
  c.metrics.add(std::move(tensorboard));
  const std::string& listen = c.s.config.services.http_listen;
  if (listen.empty()) return OkStatus();
  RunFiles files = run_files(c.run.dir);
  files.metrics = c.run.metrics;
  const size_t colon = listen.rfind(':');
  const std::string host = listen.substr(0, colon);
  RELAY_ASSIGN_OR_RETURN(
      c.endpoint, comm::MetricsEndpoint::start(host, std::atoi(listen.c_str() + colon + 1), files));
  c.metrics.add(std::make_unique<EndpointMetricsSink>(c.endpoint.get()));
  std::printf("metrics at http://%s:%d/metrics\n", host.c_str(), c.endpoint->port());
  std::printf("dashboard at http://%s:%d/\n", host.c_str(), c.endpoint->port());
  return OkStatus();
}

// Rank 0 up to the trainer: run directory, metrics, evaluation, the store,
// and resume or a fresh start.
StatusOr<internal::Started> prepare(TrainerContext& c, const TrainerRunArgs& args) {
  const ExperimentSection& ex = c.s.config.experiment;
  const std::string dir = !args.run_dir.empty()
                              ? args.run_dir
                              : (std::filesystem::path(ex.output_dir) / ex.name).string();
  c.run = run_layout(dir, args.metrics_out, args.store_dir);
  RELAY_ASSIGN_OR_RETURN(ResumePoint start,
                         prepare_run_directory(c.run, to_yaml(c.s.config), args.resume));
  RELAY_RETURN_IF_ERROR(open_metrics(c));
  const EvalConfig& ev = c.s.config.eval;
  c.split = PromptSplit{c.s.task->size(), ev.prompts};
  if (c.split.size >= 0 && c.split.size - c.split.eval < 1) {
    return InvalidArgumentError("eval.prompts: leaves no prompt to train on");
  }
  RELAY_ASSIGN_OR_RETURN(c.save_options, model_save_options(c.s));
  if (model::has_lora(*c.s.policy) && c.save_options.lora_base.empty()) {
    // A fresh model's LoRA base (model.init): saved once with the run, so
    // that its adapter checkpoints name a directory that holds it.
    const std::filesystem::path base =
        std::filesystem::absolute(std::filesystem::path(c.run.checkpoints) / "base");
    if (!std::filesystem::exists(base / "config.json")) {
      RELAY_RETURN_IF_ERROR(
          model::save_policy(*model::base_policy(*c.s.policy), base.string(), c.save_options));
    }
    c.save_options.lora_base = base.lexically_normal().string();
  }
  c.verifier = std::make_unique<rollout::SafeVerifier>(
      c.s.task, std::chrono::milliseconds(ms(c.s.config.task.verifier_timeout_s)));
  EvalOptions eo;
  eo.n = ev.n;
  eo.temperature = ev.temperature;
  c.evaluator = std::make_unique<HeldOutEvaluator>(c.s, c.split, c.verifier.get(), &c.metrics,
                                                   EvalReport::kRun, eo);
  store::StoreOptions so;
  so.path = c.run.store;
  RELAY_ASSIGN_OR_RETURN(c.store, store::RolloutStore::open(so));
  return internal::resume_or_start(c, start.checkpoint);
}

// The prompt dispenser over the store. Leases restored from the store
// belong to worker registrations of the previous process, which no worker
// can submit under any more (workers register again): their prompts go back
// in the queue now instead of holding the staleness capacity until their
// deadlines. A prompt's samples depend on its position in the stream, not
// on the lease, so it samples the same again.
StatusOr<std::unique_ptr<store::PromptDispenser>> open_dispenser(const TrainerContext& c,
                                                                 int64_t base_version) {
  const ExperimentConfig& config = c.s.config;
  store::DispenserOptions dopt;
  dopt.groups_per_step = config.experiment.groups_per_step;
  dopt.max_staleness = config.trainer.max_staleness;
  dopt.base_version = base_version;
  dopt.k = config.rollout.n;
  dopt.lease_timeout_ms = ms(config.services.lease_timeout_s);
  dopt.num_prompts = c.split.size >= 0 ? c.split.size - c.split.eval : -1;
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<store::PromptDispenser> d,
                         store::PromptDispenser::open(c.store.get(), dopt));
  int64_t orphaned = 0;
  for (const store::Lease& l : d->leases()) {
    RELAY_RETURN_IF_ERROR(d->release(l.id));
    ++orphaned;
  }
  if (orphaned > 0) {
    std::printf("re-queued %lld prompts leased before the restart\n",
                static_cast<long long>(orphaned));
  }
  return d;
}

}  // namespace
}  // namespace relay::app

namespace relay::app {
namespace {

// What a group must satisfy to be trained on under this run's settings:
// checked when it arrives and again when the trainer takes it.
comm::SubmissionLimits submission_limits(const RolloutSetup& s) {
  comm::SubmissionLimits limits;
  const model::PolicyConfig& pc = s.policy->config();
  limits.vocab_size = pc.vocab_size;
  limits.moe_layers = pc.num_moe_layers();
  limits.moe_top_k = pc.num_experts_per_tok;
  limits.num_experts = pc.num_experts;
  limits.max_context = pc.max_position_embeddings;
  limits.max_response_tokens = s.config.rollout.engine.max_new_tokens;
  limits.max_episode_tokens = s.config.rollout.engine.response_budget(/*episode=*/true);
  limits.require_behavior_logprobs = !s.config.trainer.allow_missing_logprobs;
  limits.require_teacher_logprobs = s.config.trainer.distill.enabled();
  return limits;
}

// services.weight_sync broadcast | auto: the trainer hosts the c10d group's
// store next to its gRPC port and broadcasts each version from a thread.
StatusOr<std::unique_ptr<comm::WeightBroadcaster>> start_broadcaster(
    const TrainerContext& c, const comm::WeightPublisher* publisher) {
  const ServicesConfig& sv = c.s.config.services;
  if (sv.weight_sync == comm::WeightSyncMode::kFetch)
    return std::unique_ptr<comm::WeightBroadcaster>();
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
  wo.device = c.s.policy->parameters().front().device().str();
  return comm::WeightBroadcaster::start(publisher, wo);
}

// The services workers talk to, over the trainer; destroyed in reverse
// (the server first).
struct Services {
  std::unique_ptr<store::PromptDispenser> dispenser;
  // One host copy of the weights, not two: a worker still downloading (or
  // a broadcast still sending) the previous version holds that snapshot
  // until it is done, and a worker that asks for a version no longer kept
  // takes the newer one. For a 0.5B-parameter fp32 model that is 2 GB less.
  comm::WeightPublisher publisher{/*keep=*/1};
  std::unique_ptr<comm::TrainerHost> host;
  std::unique_ptr<comm::WeightBroadcaster> broadcaster;
  std::unique_ptr<comm::TrainerService> service;
  std::unique_ptr<comm::RpcServer> server;
};

// A lease's group id and sampling seed are functions of its position in
// the prompt stream (occurrence) only, not of the lease attempt: a prompt
// leased again (expired, released, or re-queued by a restart) samples
// exactly what it would have the first time under the same weights, which
// is what makes a resumed run repeat an uninterrupted one. The epoch is in
// the id, so a finite task's prompts are new groups on every pass (and with
// fewer prompts than leases in flight, one prompt may be in flight several
// times at once).
comm::PromptSource prompt_source(const TrainerContext& c) {
  const int64_t num_prompts = c.split.size >= 0 ? c.split.size - c.split.eval : -1;
  return [&c, num_prompts](const store::Lease& lease) -> StatusOr<comm::PromptContent> {
    RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt p,
                           c.s.task->prompt(c.split.train_index(lease.prompt_index)));
    const int64_t epoch = num_prompts > 0 ? lease.occurrence / num_prompts : 0;
    RELAY_ASSIGN_OR_RETURN(
        rollout::PromptGroup g,
        prompt_group(
            c.s, p, absl::StrCat(p.id, "#", lease.occurrence, "@e", epoch),
            rollout::sequence_seed(c.s.config.run.seed, static_cast<uint64_t>(lease.occurrence))));
    comm::PromptContent content;
    content.group_id = g.group_id;
    content.prompt_tokens = std::move(g.prompt);
    content.target_tokens = std::move(g.target);
    content.seed = g.seed;
    return content;
  };
}

StatusOr<std::unique_ptr<comm::TrainerService>> make_service(const TrainerContext& c, Services& v,
                                                             const std::string& token) {
  const ServicesConfig& sv = c.s.config.services;
  comm::TrainerServiceOptions sopt;
  sopt.auth_token = token;
  sopt.worker_timeout_ms = ms(sv.worker_timeout_s);
  // Heartbeats come at least four times per liveness timeout.
  if (sopt.worker_timeout_ms > 0) {
    sopt.heartbeat_interval_ms =
        std::max<int64_t>(100, std::min<int64_t>(2000, sopt.worker_timeout_ms / 4));
  }
  if (v.broadcaster) sopt.weight_sync_endpoint = v.broadcaster->endpoint();
  sopt.max_staleness = c.s.config.trainer.max_staleness;
  sopt.greedy_baseline =
      c.s.config.trainer.advantage.estimator == trainer::AdvantageEstimator::kRemax;
  sopt.agent_prompts = !c.s.config.rollout.agent.listen.empty();
  sopt.limits = submission_limits(c.s);
  comm::TrainerHost* host = v.host.get();
  return std::make_unique<comm::TrainerService>(sopt, c.store.get(), v.dispenser.get(),
                                                &v.publisher, prompt_source(c),
                                                [host] { return host->version(); });
}

StatusOr<std::unique_ptr<Services>> start_services(const TrainerContext& c,
                                                   trainer::Trainer& trainer,
                                                   int64_t rl_start_version,
                                                   const std::string& token,
                                                   const std::string& port_file) {
  const ExperimentConfig& config = c.s.config;
  auto v = std::make_unique<Services>();
  RELAY_ASSIGN_OR_RETURN(v->dispenser, open_dispenser(c, rl_start_version));
  comm::TrainerHostOptions ho;
  ho.limits = submission_limits(c.s);
  ho.groups_per_step = config.experiment.groups_per_step;
  ho.max_staleness = config.trainer.max_staleness;
  ho.group_wait_ms = ms(config.services.group_wait_s);
  v->host = std::make_unique<comm::TrainerHost>(&trainer, c.store.get(), &v->publisher, ho);
  RELAY_RETURN_IF_ERROR(v->host->publish_current());
  RELAY_ASSIGN_OR_RETURN(v->broadcaster, start_broadcaster(c, &v->publisher));
  RELAY_ASSIGN_OR_RETURN(v->service, make_service(c, *v, token));
  comm::ServerOptions so;
  so.address = config.services.listen;
  so.tls.cert_file = config.services.tls.cert;
  so.tls.key_file = config.services.tls.key;
  if (config.services.tls.mutual) so.tls.client_ca_file = config.services.tls.ca;
  RELAY_ASSIGN_OR_RETURN(v->server, comm::RpcServer::start(so, {v->service->worker_service(),
                                                                v->service->admin_service()}));
  if (!port_file.empty()) {
    RELAY_RETURN_IF_ERROR(write_file_atomic(port_file, std::to_string(v->server->port()) + "\n"));
  }
  std::printf("serving on port %d; run directory %s; version %lld\n", v->server->port(),
              c.run.dir.c_str(), static_cast<long long>(trainer.version()));
  std::fflush(stdout);
  return v;
}

}  // namespace
}  // namespace relay::app

namespace relay::app {
namespace {

// The loop over the store's groups, and what is said when it ends.
int train(TrainerContext& c, internal::Started& r, Services& v, const TrainerRunArgs& args,
          const std::function<bool()>& stop) {
  // samples.jsonl: a few responses of every RL step, for the dashboard.
  std::ofstream samples(c.run.samples, std::ios::app);
  if (!samples) return fail(InternalError("cannot open " + c.run.samples + " for appending"));
  const ExperimentSection& ex = c.s.config.experiment;
  trainer::Trainer& tr = *r.trainer;
  comm::TrainerHost* host = v.host.get();
  internal::RunCheckpointer checkpointer(&c, r.rl_start_version);
  checkpointer.on_written([host](int64_t version) { host->set_compact_floor(version); });
  host->set_compact_floor(tr.version());
  StoreGroupSource source(host, v.service.get(), v.server.get(), v.broadcaster.get(), stop);
  LoopParts parts;
  parts.source = &source;
  parts.evaluator = c.evaluator.get();
  parts.metrics = &c.metrics;
  parts.checkpointer = &checkpointer;
  parts.stop = stop;
  parts.on_step = [&](const StepReport& s) {
    samples << samples_jsonl_line(s.rl_step, tr.version(),
                                  comm::sample_records(*s.groups, *c.s.tokenizer, 4))
            << "\n"
            << std::flush;
    if (!samples) spdlog::warn("cannot append to {}", c.run.samples);
    const trainer::StepMetrics& m = *s.metrics;
    std::printf(
        "step %lld/%d  v%lld  reward %.3f  accuracy %s  staleness %.2f (max %.0f)  %s samples/s"
        "  waited %.2fs  mismatch %.1e\n",
        static_cast<long long>(s.rl_step), ex.steps, static_cast<long long>(tr.version()),
        m.at("reward/mean"),
        std::isnan(s.last_accuracy) ? "-" : absl::StrFormat("%.3f", s.last_accuracy).c_str(),
        m.at("staleness/mean"), m.at("staleness/max"),
        format_significant(m.at("throughput/samples_per_s")).c_str(), m.at("store/wait_s"),
        m.at("mismatch/k3"));
    std::fflush(stdout);
  };
  if (!args.save.empty()) {
    parts.final_save = [&](const trainer::Trainer& t) {
      return model::save_policy(*t.policy(), args.save, c.save_options);
    };
  }
  const LoopOptions lo{ex.steps, c.s.config.eval.every, ex.checkpoint_every,
                       ex.keep_best_checkpoint};
  LoopEnd end = TrainingLoop(lo, std::move(parts)).run(tr, r.state);
  const store::DispenserStats ds = v.dispenser->stats();
  std::printf(
      "dispenser: %lld groups accepted in all, %lld leases expired, %lld released, %lld late "
      "submissions rejected, %lld leases open\n",
      static_cast<long long>(ds.accepted), static_cast<long long>(ds.expired_leases),
      static_cast<long long>(ds.released), static_cast<long long>(ds.rejected_late),
      static_cast<long long>(ds.in_flight));
  if (c.leader) {
    if (Status st = c.leader->stop(); !st.ok() && end.status.ok()) end.status = st;
    print_weights_digest(*tr.policy(), 0);
  }
  if (!end.status.ok()) return fail(end.status);
  std::printf("%s: version %lld, step %lld of %d\n", end.finished ? "done" : "stopped",
              static_cast<long long>(host->version()), static_cast<long long>(r.state.rl_step),
              ex.steps);
  return 0;
}

// Every way out of the run stops the other ranks (they would otherwise wait
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
};

}  // namespace

int run_trainer(const TrainerRunArgs& args, const std::function<void()>& on_serving,
                const std::function<bool()>& stop) {
  StatusOr<RolloutSetup> setup = setup_rollout(args.setup);
  if (!setup.ok()) return fail(setup.status());
  TrainerContext c;
  c.s = *std::move(setup);
  StatusOr<trainer::TrainerOptions> options = trainer_options(c.s);
  if (!options.ok()) return fail(options.status());
  c.options = *options;
  // trainer.world_size > 1: every rank runs this program with the same
  // config. Rank 0 goes on below; the others make its trainer calls on
  // their shards of each batch and touch nothing else (no ports, no run
  // directory).
  StatusOr<comm::TrainerRank> place = trainer_rank(c.s.config);
  if (!place.ok()) return fail(place.status());
  StatusOr<std::shared_ptr<trainer::Collectives>> group =
      join_trainer_ranks(c.s.config, *place, c.s.policy->parameters().front().device().str());
  if (!group.ok()) return fail(group.status());
  if (place->rank > 0) return run_follower_rank(c.s, c.options, *place, *group);
  if (*group) c.leader = std::make_unique<comm::RankLeader>(*group);
  const StopFollowers stop_followers{c.leader.get()};
  c.bucket_bytes = int64_t{c.s.config.trainer.data_parallel.allreduce_bucket_mb} << 20;
  StatusOr<std::string> token = auth_token(c.s.config.services, args.token);
  if (!token.ok()) return fail(token.status());
  StatusOr<internal::Started> started = prepare(c, args);
  if (!started.ok()) return fail(started.status());
  StatusOr<std::unique_ptr<Services>> services =
      start_services(c, *started->trainer, started->rl_start_version, *token, args.port_file);
  if (!services.ok()) return fail(services.status());
  if (on_serving) on_serving();
  return train(c, *started, **services, args, stop);
}

}  // namespace relay::app
