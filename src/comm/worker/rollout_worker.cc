#include "relay/comm/worker/rollout_worker.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "relay/model/core_share.h"
#include "relay/model/lora.h"
#include "relay/model/weight_manifest.h"
#include "relay/v1/worker.pb.h"

namespace relay::comm {
namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

RolloutWorker::RolloutWorker(std::unique_ptr<TrainerClient> client, model::Policy policy,
                             rollout::EngineOptions engine_options,
                             std::shared_ptr<const rollout::Task> task,
                             std::shared_ptr<const model::Tokenizer> tokenizer,
                             std::chrono::milliseconds verifier_timeout,
                             RolloutWorkerOptions options,
                             std::shared_ptr<const env::EnvironmentFactory> environment,
                             rollout::EpisodeDriverOptions episode_options)
    : client_(std::move(client)),
      policy_(std::move(policy)),
      engine_options_(std::move(engine_options)),
      task_(std::move(task)),
      tokenizer_(std::move(tokenizer)),
      verifier_(task_, verifier_timeout),
      options_(std::move(options)),
      environment_(std::move(environment)),
      episode_options_(episode_options) {}

RolloutWorker::~RolloutWorker() { stop_agents(); }

int64_t RolloutWorker::version() const { return engine() ? engine()->version() : -1; }

std::string RolloutWorker::agent_url() const {
  if (!server_) return "";
  return absl::StrCat("http://", options_.agents->serve.host, ":", server_->port(), "/v1");
}

// The engine moves onto the serving thread, and the endpoint starts, on the
// port of the last start if there was one (agents keep their URL).
Status RolloutWorker::start_agents() {
  serve::ServeOptions so = options_.agents->serve;
  if (agent_port_ != 0) so.port = agent_port_;
  so.run_sampling = serve::ServeOptions::RunSampling{engine_options_.sampling.temperature,
                                                     engine_options_.sampling.top_k,
                                                     engine_options_.sampling.top_p};
  agent_episodes_ = std::make_unique<AgentEpisodes>(options_.agents->episodes);
  serving_ = std::make_unique<serve::ServingEngine>(std::move(engine_));
  RELAY_ASSIGN_OR_RETURN(server_,
                         serve::OpenAiServer::start(so, options_.agents->model, *serving_));
  server_->set_episode_source(agent_episodes_.get());
  agent_port_ = server_->port();
  spdlog::info("worker {}: agents play episodes through {}", worker_id_, agent_url());
  return OkStatus();
}

// Agents are told the run is over (410), requests in flight end, then the
// endpoint and the engine go.
void RolloutWorker::stop_agents() {
  if (agent_episodes_) agent_episodes_->close();
  if (serving_) serving_->stop();
  server_.reset();
  serving_.reset();
  agent_episodes_.reset();
}

Status RolloutWorker::start() {
  // Also a restart after the trainer went away: leases of the old
  // registration cannot be submitted any more.
  episodes_.reset();  // before the engine whose turns it answers
  stop_agents();
  engine_.reset();
  receiver_.reset();
  fetcher_.reset();  // a download of the old registration's ends first
  waiting_for_ = -1;
  in_flight_.clear();
  waiting_.clear();
  wait_for_version_ = -1;
  retry_lease_at_ms_ = 0;
  last_heartbeat_ms_ = 0;
  v1::WorkerCapabilities caps;
  caps.set_device(policy_->parameters().front().device().str());
  caps.set_num_slots(static_cast<int32_t>(engine_options_.num_slots));
  caps.set_weight_sync_group(options_.weight_sync != WeightSyncMode::kFetch);
  RELAY_ASSIGN_OR_RETURN(v1::RegisterWorkerResponse reg,
                         client_->register_worker(options_.name, caps));
  worker_id_ = reg.worker_id();
  // The trainer's interval keeps this worker inside its liveness timeout.
  if (reg.heartbeat_interval_ms() > 0) {
    options_.heartbeat_ms = std::min(options_.heartbeat_ms, reg.heartbeat_interval_ms());
  }
  // The trainer's weights, verified against the published digest. A worker
  // that loaded the same model directory as the trainer already holds
  // version 0 (or any version whose bytes it has): only the manifest
  // travels, not the model (2 GB for a 0.5B-parameter fp32 model).
  const auto t0 = std::chrono::steady_clock::now();
  // What a version carries: every parameter (read in place, not copied),
  // or with LoRA the adapters and the base's digest (model::published_weights).
  model::WeightManifest held;
  if (model::has_lora(*policy_)) {
    RELAY_ASSIGN_OR_RETURN(auto own, model::published_weights(*policy_, &base_digest_));
    RELAY_ASSIGN_OR_RETURN(held, model::weight_manifest(own, 0));
  } else {
    RELAY_ASSIGN_OR_RETURN(held, model::weight_manifest(*policy_, 0));
  }
  RELAY_ASSIGN_OR_RETURN(FetchedWeights w,
                         client_->fetch_weights(worker_id_, -1, options_.fetch_chunk_bytes, &held));
  spdlog::info("worker {}: version {}: {} in {:.1f} s", worker_id_, w.manifest.version,
               w.already_held ? "already held (loaded from the same model directory)"
                              : "fetched from the trainer",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  RELAY_RETURN_IF_ERROR(load_weights(w));
  RELAY_ASSIGN_OR_RETURN(engine_, rollout::Engine::create(policy_, engine_options_,
                                                          w.manifest.version, w.manifest.digest));
  if (environment_) {
    episodes_ = std::make_unique<rollout::EpisodeDriver>(*engine_, environment_, tokenizer_,
                                                         episode_options_);
  }
  latest_known_ = staged_version_ = w.manifest.version;
  running_digest_ = w.manifest.digest;
  if (options_.agents) RELAY_RETURN_IF_ERROR(start_agents());
  if (options_.fetch_in_background) {
    fetcher_ = std::make_unique<WeightFetcher>(client_.get(), worker_id_,
                                               static_cast<uint64_t>(options_.fetch_chunk_bytes));
  }
  RELAY_RETURN_IF_ERROR(join_weight_sync(reg.weight_sync_endpoint()));
  spdlog::info("worker {}: registered, running version {} (digest {:x})", worker_id_,
               w.manifest.version, w.manifest.digest);
  return OkStatus();
}

// The trainer's tensors into this worker's policy, each checked by name and
// shape.
Status RolloutWorker::load_weights(const FetchedWeights& w) {
  torch::NoGradGuard no_grad;
  auto params = policy_->named_parameters();
  for (const auto& [name, t] : w.tensors) {
    if (name == model::kBaseDigestTensor) {
      const auto theirs = static_cast<uint64_t>(t.item<int64_t>());
      if (!base_digest_ || theirs != *base_digest_) {
        return FailedPreconditionError(absl::StrFormat(
            "worker: the trainer's LoRA adapters were trained on base weights with digest %x, "
            "and this worker's base has digest %x; start the worker with the trainer's model "
            "directory",
            theirs, base_digest_.value_or(0)));
      }
      continue;
    }
    at::Tensor* p = params.find(name);
    if (p == nullptr || p->sizes() != t.sizes()) {
      return FailedPreconditionError(absl::StrCat(
          "worker: the trainer's weights name '", name,
          "', which this model does not have with that shape; start the worker with the "
          "trainer's model directory"));
    }
    p->copy_(t);
  }
  return OkStatus();
}

// With services.weight_sync broadcast or auto, joins the trainer's c10d group
// at `endpoint` (empty: the trainer offers none).
Status RolloutWorker::join_weight_sync(const std::string& endpoint) {
  if (options_.weight_sync == WeightSyncMode::kFetch) return OkStatus();
  if (endpoint.empty()) {
    if (options_.weight_sync == WeightSyncMode::kBroadcast) {
      return FailedPreconditionError(
          "worker: services.weight_sync is broadcast, but the trainer offers no weight-sync "
          "group (its services.weight_sync is fetch)");
    }
    return OkStatus();
  }
  WeightSyncClientOptions so;
  so.endpoint = endpoint;
  so.member_name = worker_id_;
  so.timeout = std::chrono::milliseconds(options_.weight_sync_timeout_ms);
  so.device = policy_->parameters().front().device().str();
  StatusOr<std::unique_ptr<WeightReceiver>> r = WeightReceiver::start(so);
  if (r.ok()) {
    receiver_ = *std::move(r);
  } else if (options_.weight_sync == WeightSyncMode::kBroadcast) {
    return r.status();
  } else {
    spdlog::warn("worker {}: cannot join the weight-sync group at {} ({}); fetching instead",
                 worker_id_, endpoint, std::string(r.status().message()));
  }
  return OkStatus();
}

Status RolloutWorker::fill_leases() {
  // Every turn of the loop, full or not: a version that arrived is staged
  // (not at the next heartbeat), and the groups waiting for it start.
  RELAY_RETURN_IF_ERROR(stage_arrived());
  RELAY_RETURN_IF_ERROR(admit_waiting());
  const int want = options_.max_groups_in_flight - static_cast<int>(in_flight_.size());
  if (want <= 0) return OkStatus();
  // After an empty answer, ask again when the version the trainer named
  // arrives, or after idle_wait_ms anyway: capacity also comes back within a
  // version (a refused group's lease is given back), and waiting only for the
  // next version could then wait forever.
  if (wait_for_version_ >= 0 && latest_known_ < wait_for_version_ &&
      now_ms() < retry_lease_at_ms_) {
    return OkStatus();
  }
  RELAY_ASSIGN_OR_RETURN(v1::LeasePromptsResponse resp, client_->lease_prompts(worker_id_, want));
  wait_for_version_ = resp.leases_size() == 0 ? resp.wait_for_version() : -1;
  retry_lease_at_ms_ = now_ms() + options_.idle_wait_ms;
  // Stage a newer version before admitting the new groups, so they start on
  // it; while it downloads they wait for it.
  latest_known_ = std::max(latest_known_, resp.latest_version());
  RELAY_RETURN_IF_ERROR(maybe_update_weights(latest_known_));
  for (const v1::PromptLease& l : resp.leases()) {
    RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt prompt, task_->prompt(l.prompt_index()));
    rollout::PromptGroup g;
    g.group_id = l.group_id();
    g.prompt.assign(l.prompt_tokens().begin(), l.prompt_tokens().end());
    g.target.assign(l.target_tokens().begin(), l.target_tokens().end());
    g.k = l.k();
    g.seed = l.seed();
    g.greedy_baseline = l.greedy_baseline();
    in_flight_[l.group_id()] = Leased{l.lease_id(), std::move(prompt)};
    if (fetching_newer()) {
      waiting_.push_back(Waiting{std::move(g), l.lease_id(), latest_known_});
    } else {
      RELAY_RETURN_IF_ERROR(admit(std::move(g), l.lease_id()));
    }
  }
  return admit_waiting();
}

Status RolloutWorker::admit(rollout::PromptGroup g, uint64_t lease_id) {
  const rollout::TaskPrompt& prompt = in_flight_.at(g.group_id).prompt;
  if (agent_episodes_) {
    agent_episodes_->add_group(g.group_id, lease_id, prompt, g.k, engine()->version());
    return OkStatus();
  }
  if (episodes_) {
    g.episode = true;
    episodes_->begin_group(g.group_id, {prompt.id, prompt.prompt, prompt.reference});
  }
  return engine()->submit(std::move(g));
}

Status RolloutWorker::admit_waiting() {
  // Without a download under way (it failed as superseded, say), waiting
  // for the version would wait for nothing: they start on what is staged.
  const bool downloading = fetching_newer();
  while (!waiting_.empty() && (waiting_.front().version <= staged_version_ || !downloading)) {
    Waiting w = std::move(waiting_.front());
    waiting_.pop_front();
    RELAY_RETURN_IF_ERROR(admit(std::move(w.group), w.lease_id));
  }
  return OkStatus();
}

bool RolloutWorker::fetching_newer() const {
  return fetcher_ && fetcher_->pending() && fetcher_->wanted() > staged_version_;
}

Status RolloutWorker::stage(int64_t version, uint64_t digest,
                            std::unordered_map<std::string, at::Tensor> tensors) {
  // The agents' engine is stepped by its serving thread, which applies the
  // version at once when no request is in flight.
  RELAY_RETURN_IF_ERROR(serving_ ? serving_->update_weights(version, digest, std::move(tensors))
                                 : engine()->update_weights(version, digest, std::move(tensors)));
  running_digest_ = digest;
  staged_version_ = version;
  latest_known_ = std::max(latest_known_, version);
  ++stats_.versions_applied;
  return OkStatus();
}

Status RolloutWorker::stage_fetched() {
  std::optional<StatusOr<FetchedWeights>> w = fetcher_->take();
  if (!w) return OkStatus();
  if (!w->ok()) return w->status();
  // A version that came by broadcast meanwhile may be as new.
  if ((*w)->manifest.version <= staged_version_) return OkStatus();
  return stage((*w)->manifest.version, (*w)->manifest.digest, std::move((*w)->tensors));
}

Status RolloutWorker::stage_arrived() {
  if (receiver_) {
    if (std::optional<ReceivedVersion> r = receiver_->take(staged_version_)) {
      RELAY_RETURN_IF_ERROR(stage(r->version, r->manifest.digest, std::move(r->tensors)));
      ++stats_.versions_broadcast;
    }
  }
  if (fetcher_) {
    RELAY_RETURN_IF_ERROR(stage_fetched());
    // The next download starts once the engine has applied the version
    // staged last (weight_fetcher.h, "held"); this runs every turn, and an
    // idle engine is stepped for it (run(); the agents' serving thread).
    if (engine()->version() >= staged_version_) fetcher_->release();
  }
  return OkStatus();
}

Status RolloutWorker::maybe_update_weights(int64_t latest) {
  // A version that arrived is staged first, whatever `latest` says.
  RELAY_RETURN_IF_ERROR(stage_arrived());
  // The engine applies a staged version at its next step: compare with the
  // newest version handed to it, not the one it samples with now.
  if (latest <= staged_version_) return OkStatus();
  if (receiver_ && receiver_->healthy()) {
    // The broadcast is on its way; fetch only if it is late.
    const int64_t now = now_ms();
    if (latest != waiting_for_) {
      waiting_for_ = latest;
      waiting_since_ms_ = now;
    }
    if (now - waiting_since_ms_ < options_.broadcast_grace_ms) return OkStatus();
  }
  if (fetcher_) {
    fetcher_->want(latest);
    return OkStatus();
  }
  StatusOr<FetchedWeights> w = fetch_verified(*client_, worker_id_, latest,
                                              static_cast<uint64_t>(options_.fetch_chunk_bytes));
  if (!w.ok() && w.status().code() == absl::StatusCode::kNotFound) {
    return OkStatus();  // superseded while we asked; the next heartbeat names the newer one
  }
  if (!w.ok()) return w.status();
  return stage(w->manifest.version, w->manifest.digest, std::move(w->tensors));
}

Status RolloutWorker::submit_finished(std::vector<rollout::TrajectoryGroup> groups) {
  if (groups.empty()) return OkStatus();
  // The teacher's log-probs go into the trajectories the store keeps.
  if (teacher_) RELAY_RETURN_IF_ERROR(teacher_->score(groups));
  std::vector<std::pair<uint64_t, rollout::TrajectoryGroup>> batch;
  for (rollout::TrajectoryGroup& g : groups) {
    auto it = in_flight_.find(g.group_id);
    if (it == in_flight_.end()) {
      return InternalError(
          absl::StrCat("worker: finished group '", g.group_id, "' was not leased"));
    }
    auto score = [&](rollout::Trajectory& t) -> Status {
      if (agent_episodes_ && std::isfinite(t.reward)) {
        // The reward the agent posted; without one the verifier scores.
        t.sub_scores["agent"] = t.reward;
        return OkStatus();
      }
      // An episode's answer is its last model turn.
      StatusOr<std::string> text = tokenizer_->decode(t.answer_tokens());
      if (!text.ok()) {
        // A model whose vocabulary is padded past the tokenizer's can sample
        // an id with no text: that response earns nothing, and is counted.
        ++stats_.decode_errors;
        spdlog::warn("worker {}: group '{}': {}; reward 0", worker_id_, g.group_id,
                     std::string(text.status().message()));
        t.reward = 0.0;
        return OkStatus();
      }
      const rollout::Score s = rollout::episode_score(verifier_.score(it->second.prompt, *text), t);
      t.reward = s.reward;
      t.sub_scores = s.sub_scores;
      return OkStatus();
    };
    for (rollout::Trajectory& t : g.trajectories) RELAY_RETURN_IF_ERROR(score(t));
    if (g.baseline) RELAY_RETURN_IF_ERROR(score(*g.baseline));
    if (episodes_) episodes_->end_group(g.group_id);
    batch.emplace_back(it->second.lease_id, std::move(g));
    in_flight_.erase(it);
  }
  RELAY_ASSIGN_OR_RETURN(std::vector<v1::SubmitGroupAck> acks,
                         client_->submit_groups(worker_id_, batch));
  std::vector<uint64_t> give_back;
  for (const v1::SubmitGroupAck& ack : acks) {
    ++stats_.groups_submitted;
    if (ack.accepted()) {
      ++stats_.groups_accepted;
    } else {
      ++stats_.groups_refused;
      spdlog::warn("worker {}: lease {} refused: {}", worker_id_, ack.lease_id(),
                   ack.error_message());
      // A malformed group keeps its lease for a corrected resubmission; this
      // worker has nothing better to send, so it gives the lease back and the
      // prompt is leased again now instead of at the deadline.
      if (ack.error_code() == static_cast<int32_t>(absl::StatusCode::kInvalidArgument)) {
        give_back.push_back(ack.lease_id());
      }
    }
  }
  if (!give_back.empty()) {
    RELAY_RETURN_IF_ERROR(client_->release_leases(worker_id_, give_back).status());
  }
  return OkStatus();
}

Status RolloutWorker::heartbeat_if_due() {
  const int64_t now = now_ms();
  if (now - last_heartbeat_ms_ < options_.heartbeat_ms && wait_for_version_ < 0) {
    return OkStatus();
  }
  last_heartbeat_ms_ = now;
  v1::HeartbeatRequest hb;
  hb.set_worker_id(worker_id_);
  hb.set_running_version(engine()->version());
  hb.set_running_digest(running_digest_);
  hb.set_in_flight(static_cast<int32_t>(in_flight_.size()));
  RELAY_ASSIGN_OR_RETURN(v1::HeartbeatResponse resp, client_->heartbeat(hb));
  if (resp.reregister()) {
    return UnavailableError("worker: the trainer no longer knows this worker (restarted?)");
  }
  latest_known_ = std::max(latest_known_, resp.latest_version());
  return maybe_update_weights(resp.latest_version());
}

StatusOr<int32_t> RolloutWorker::drain() {
  stop_agents();
  if (engine_) engine_->abort();
  receiver_.reset();  // leaves the weight-sync group
  std::vector<uint64_t> ids;
  for (const auto& [group_id, leased] : in_flight_) ids.push_back(leased.lease_id);
  in_flight_.clear();
  waiting_.clear();
  if (ids.empty()) return 0;
  return client_->release_leases(worker_id_, ids);
}

// Waits on the trainer's version stream for up to idle_wait_ms, and stages
// a version announced meanwhile.
Status RolloutWorker::wait_for_version() {
  RELAY_ASSIGN_OR_RETURN(std::optional<v1::VersionAnnouncement> next,
                         client_->next_version(worker_id_, latest_known_, options_.idle_wait_ms));
  if (!next) return OkStatus();
  latest_known_ = std::max(latest_known_, next->version());
  return maybe_update_weights(next->version());
}

Status RolloutWorker::run(const std::function<bool()>& stop) {
  if (!engine()) return FailedPreconditionError("worker: run() before start()");
  if (serving_) return run_agents(stop);
  while (!stop()) {
    RELAY_RETURN_IF_ERROR(heartbeat_if_due());
    RELAY_RETURN_IF_ERROR(fill_leases());
    if (engine_->idle()) {
      if (engine_->version() < staged_version_) {
        // An engine applies a staged version at its next step, and an idle
        // one takes none: apply it now. The host then holds the weights
        // once while the worker waits (not the engine's and the staged
        // copy), and twice, not three times, while the next one downloads.
        RELAY_RETURN_IF_ERROR(engine_->step().status());
        ++stats_.engine_steps;
        continue;
      }
      // The trainer trains on the machine's cores meanwhile (core_share.h).
      // Not a scope: an idle worker turns this loop every idle_wait_ms, and
      // a busy blip each turn would take cores from the trainer's next
      // micro-batch.
      model::cores_busy(false);
      if (fetching_newer()) {
        // Nothing to decode until the version downloading lands; the next
        // turn's fill_leases stages it and starts the groups waiting for it.
        fetcher_->wait(std::chrono::milliseconds(options_.idle_wait_ms));
        continue;
      }
      // Nothing to do until the trainer publishes.
      RELAY_RETURN_IF_ERROR(wait_for_version());
      continue;
    }
    model::cores_busy(true);
    RELAY_ASSIGN_OR_RETURN(std::vector<rollout::TrajectoryGroup> done, engine_->step());
    ++stats_.engine_steps;
    RELAY_RETURN_IF_ERROR(submit_finished(std::move(done)));
  }
  return OkStatus();
}

// The loop with agents: the serving thread steps the engine; this one keeps
// the leases filled, follows versions and submits the groups agents finish.
Status RolloutWorker::run_agents(const std::function<bool()>& stop) {
  while (!stop()) {
    if (Status h = serving_->health(); !h.ok()) {
      return InternalError(absl::StrCat("worker: the engine failed: ", h.message()));
    }
    RELAY_RETURN_IF_ERROR(heartbeat_if_due());
    RELAY_RETURN_IF_ERROR(fill_leases());
    AgentEpisodes::Collected c = agent_episodes_->collect();
    std::vector<uint64_t> give_back;
    for (const AgentEpisodes::Dropped& d : c.dropped) {
      ++stats_.agent_groups_dropped;
      spdlog::warn("worker {}: group '{}' dropped: {}; its lease goes back", worker_id_, d.group_id,
                   d.reason);
      in_flight_.erase(d.group_id);
      give_back.push_back(d.lease_id);
    }
    if (!give_back.empty()) {
      RELAY_RETURN_IF_ERROR(client_->release_leases(worker_id_, give_back).status());
    }
    std::vector<rollout::TrajectoryGroup> done;
    for (AgentEpisodes::Complete& g : c.complete) done.push_back(std::move(g.group));
    RELAY_RETURN_IF_ERROR(submit_finished(std::move(done)));
    // Nothing finished: idle_wait_ms also bounds how late a finished group
    // is collected.
    if (c.complete.empty() && c.dropped.empty()) RELAY_RETURN_IF_ERROR(wait_for_version());
  }
  return OkStatus();
}

}  // namespace relay::comm
