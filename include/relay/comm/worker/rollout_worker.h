#pragma once

// The rollout worker's loop (what `relay-rollout` runs): register with the
// trainer, fetch and verify its weights, then lease prompts, generate K
// samples per prompt with the rollout engine, score them with the task's
// verifier and submit each group on its lease. New versions arrive by
// broadcast or are fetched (digest-checked), both off the loop's thread, and
// are staged into the engine, which applies them between decode steps
// (interruptible generation, docs/rollout.md); the trainer does not wait for
// them. Groups leased while a newer version than the engine's downloads
// wait for it, so that they are sampled with it; the groups in flight go
// on decoding meanwhile.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "relay/comm/rpc/trainer_client.h"
#include "relay/comm/weight_sync/weight_receiver.h"
#include "relay/comm/weight_sync/weight_sync_mode.h"
#include "relay/comm/worker/agent_episodes.h"
#include "relay/comm/worker/weight_fetcher.h"
#include "relay/common/status.h"
#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"
#include "relay/rollout/engine.h"
#include "relay/rollout/episode_driver.h"
#include "relay/rollout/task.h"
#include "relay/rollout/teacher.h"
#include "relay/serve/openai_server.h"
#include "relay/serve/serving_engine.h"

namespace relay::comm {

struct RolloutWorkerOptions {
  std::string name = "worker";
  int max_groups_in_flight = 4;  // leases held at once
  int64_t heartbeat_ms = 2000;
  int64_t idle_wait_ms = 50;      // when nothing can be leased: wait for a version this long
  int64_t fetch_chunk_bytes = 0;  // 0 = the trainer's default
  // services.weight_sync: fetch | broadcast | auto. With broadcast or auto the
  // worker joins the trainer's c10d group when the trainer offers one;
  // broadcast makes failing to join an error, auto falls back to fetching.
  WeightSyncMode weight_sync = WeightSyncMode::kFetch;
  int64_t weight_sync_timeout_ms = 30000;
  // While the broadcast works, a version the trainer announced is fetched
  // over gRPC only if it has not arrived by broadcast within this long.
  int64_t broadcast_grace_ms = 2000;
  // Versions are fetched on a thread of their own (WeightFetcher) while the
  // loop decodes. false: the loop fetches them itself and decodes nothing
  // meanwhile (how the worker fetched until 2026-11-30; the benchmark's
  // baseline).
  bool fetch_in_background = true;
  // rollout.agent: agents play the samples through this endpoint (its
  // run_sampling is set from the engine's options); nullopt = the engine
  // samples them itself.
  struct Agents {
    serve::ServeOptions serve;
    serve::ServedModel model;
    AgentEpisodesOptions episodes;
  };
  std::optional<Agents> agents;
};

struct RolloutWorkerStats {
  int64_t groups_submitted = 0;
  int64_t groups_accepted = 0;
  int64_t groups_refused = 0;  // with the trainer's reason logged
  int64_t versions_applied = 0;
  int64_t versions_broadcast = 0;  // of those, received by c10d broadcast (else fetched)
  int64_t engine_steps = 0;
  int64_t decode_errors = 0;         // responses the tokenizer could not decode (reward 0)
  int64_t agent_groups_dropped = 0;  // an episode timed out, or the prompts differed
};

class RolloutWorker {
 public:
  // `client` reaches the trainer (GrpcTrainerClient; a fake in tests).
  // `policy` has the trainer's architecture (its weights are replaced by the
  // fetched ones); `task` maps a leased prompt index to what the verifier
  // needs; `tokenizer` decodes responses for it. With an `environment`
  // every leased group is a group of episodes whose turns it answers
  // (rollout/episode_driver.h) with `episode_options`.
  RolloutWorker(std::unique_ptr<TrainerClient> client, model::Policy policy,
                rollout::EngineOptions engine_options, std::shared_ptr<const rollout::Task> task,
                std::shared_ptr<const model::Tokenizer> tokenizer,
                std::chrono::milliseconds verifier_timeout, RolloutWorkerOptions options,
                std::shared_ptr<const env::EnvironmentFactory> environment = nullptr,
                rollout::EpisodeDriverOptions episode_options = {});
  ~RolloutWorker();

  // Registers, downloads the current version and starts the engine. Called
  // again after run() found the trainer gone (restarted), it registers anew
  // and forgets the old registration's leases.
  Status start();
  // Works until `stop()` returns true (checked between engine steps) or an
  // error the loop cannot go on from (the trainer unreachable past the
  // client's deadline, a version that fails its digest twice).
  Status run(const std::function<bool()>& stop);
  // After run() returned: stops generating and gives every open lease back
  // to the trainer, so its prompt is leased again at once; how many the
  // trainer released.
  StatusOr<int32_t> drain();

  const RolloutWorkerStats& stats() const { return stats_; }
  const std::string& worker_id() const { return worker_id_; }
  int64_t version() const;
  // With agents, once started: the endpoint's base URL, "http://host:port/v1"
  // (the same port after a restart); "" otherwise.
  std::string agent_url() const;
  bool serves_agents() const { return options_.agents.has_value(); }
  // On-policy distillation (trainer.distill): every finished group's
  // samples are scored by `teacher` before they are submitted. Set before
  // start(); null = no teacher.
  void set_teacher(std::unique_ptr<rollout::Teacher> teacher) { teacher_ = std::move(teacher); }
  const rollout::Teacher* teacher() const { return teacher_.get(); }

 private:
  Status load_weights(const FetchedWeights& w);
  Status join_weight_sync(const std::string& endpoint);
  Status fill_leases();
  Status maybe_update_weights(int64_t latest);
  // The fetcher's finished download, staged if it is newer than the staged
  // version; its error if it failed.
  Status stage_fetched();
  // What arrived by broadcast, then by download, staged.
  Status stage_arrived();
  // Hands a verified version to the engine (applied at its next step).
  Status stage(int64_t version, uint64_t digest,
               std::unordered_map<std::string, at::Tensor> tensors);
  // A download of a version newer than the staged one is under way.
  bool fetching_newer() const;
  // Starts a leased group on the engine (or offers it to the agents).
  Status admit(rollout::PromptGroup group, uint64_t lease_id);
  // Admits the groups waiting for a version once it is staged, or once no
  // download is under way any more.
  Status admit_waiting();
  Status submit_finished(std::vector<rollout::TrajectoryGroup> groups);
  Status heartbeat_if_due();
  Status wait_for_version();
  Status start_agents();
  void stop_agents();
  Status run_agents(const std::function<bool()>& stop);
  // The engine, whether this worker steps it or the serving thread does.
  rollout::Engine* engine() const { return serving_ ? &serving_->engine() : engine_.get(); }

  std::unique_ptr<TrainerClient> client_;
  // Declared after client_, which it calls: it goes (and its thread ends)
  // first. Null with fetch_in_background false, and before start().
  std::unique_ptr<WeightFetcher> fetcher_;
  model::Policy policy_;
  std::optional<uint64_t> base_digest_;  // LoRA: this worker's frozen base, hashed once
  rollout::EngineOptions engine_options_;
  std::shared_ptr<const rollout::Task> task_;
  std::shared_ptr<const model::Tokenizer> tokenizer_;
  rollout::SafeVerifier verifier_;
  std::unique_ptr<rollout::Teacher> teacher_;
  RolloutWorkerOptions options_;
  std::unique_ptr<rollout::Engine> engine_;
  std::shared_ptr<const env::EnvironmentFactory> environment_;
  rollout::EpisodeDriverOptions episode_options_;
  // Answers the engine's episode turns; declared after engine_, so it goes
  // first (it is the engine's turn handler).
  std::unique_ptr<rollout::EpisodeDriver> episodes_;
  // Agents: the episodes offered, the engine on its serving thread, and the
  // endpoint, torn down in the reverse order.
  std::unique_ptr<AgentEpisodes> agent_episodes_;
  std::unique_ptr<serve::ServingEngine> serving_;
  std::unique_ptr<serve::OpenAiServer> server_;
  int agent_port_ = 0;
  std::unique_ptr<WeightReceiver> receiver_;  // null = fetch only
  int64_t waiting_for_ = -1;                  // newest announced version not staged yet
  int64_t waiting_since_ms_ = 0;              // ... known since
  std::string worker_id_;
  int64_t latest_known_ = -1;
  int64_t staged_version_ = -1;  // newest version given to the engine
  uint64_t running_digest_ = 0;
  int64_t wait_for_version_ = -1;  // the bound said wait; lease again at this version
  int64_t retry_lease_at_ms_ = 0;  // ... or at this time
  struct Leased {
    uint64_t lease_id;
    rollout::TaskPrompt prompt;
  };
  std::map<std::string, Leased> in_flight_;  // by group id, those waiting too
  // Leased while a newer version downloaded: started once it is staged.
  struct Waiting {
    rollout::PromptGroup group;
    uint64_t lease_id;
    int64_t version;  // the version they wait for
  };
  std::deque<Waiting> waiting_;
  int64_t last_heartbeat_ms_ = 0;
  RolloutWorkerStats stats_;
};

}  // namespace relay::comm
