#pragma once

// One rollout engine driven on a thread of its own for requests that arrive
// on other threads (the HTTP server's): each request is a group submitted
// with a listener that hears its tokens as they are sampled and gets the
// group back when it is done. The engine steps while anything is in flight
// and sleeps on a condition variable otherwise, with the process marked
// waiting in its core share meanwhile (model/core_share.h).
//
// A failed engine step (a model error, out of memory) fails every request in
// flight with that status, and the engine takes nothing more: health() says
// why, and the server answers 503 from then on.

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "relay/common/status.h"
#include "relay/rollout/engine.h"

namespace relay::serve {

// What a request hears. Both calls come on the engine thread.
class GroupListener {
 public:
  virtual ~GroupListener() = default;
  // Tokens just sampled for the group, in order; may call
  // ServingEngine::end_sample (a stop string matched) before the next step.
  virtual void on_tokens(const std::vector<rollout::SampledToken>& tokens) = 0;
  // The group is complete, or failed with the engine.
  virtual void on_done(StatusOr<rollout::TrajectoryGroup> group) = 0;
};

class ServingEngine {
 public:
  // Starts the engine thread. The engine must have no token handler yet.
  explicit ServingEngine(std::unique_ptr<rollout::Engine> engine);
  // Aborts what is in flight (each listener gets its group back, aborted)
  // and joins the thread.
  ~ServingEngine();
  ServingEngine(const ServingEngine&) = delete;
  ServingEngine& operator=(const ServingEngine&) = delete;

  // Queues a group (stream_tokens is set here). The engine's own refusals
  // (engine.h, submit) come back as they are; Unavailable once the engine
  // has failed or is stopping.
  Status submit(rollout::PromptGroup group, std::shared_ptr<GroupListener> listener);
  // Takes nothing more and ends what is in flight: each listener gets its
  // group back, aborted. Called first when shutting down, so that handlers
  // waiting on their groups return before the server waits for them.
  void stop();
  // Engine::end_sample, from any thread.
  Status end_sample(const std::string& group_id, int sample, rollout::FinishReason reason);
  // Engine::update_weights. With nothing in flight the engine thread steps
  // once, so the version lands now rather than at the next request: the
  // staged copy is not held beside the weights while the agents are idle.
  Status update_weights(int64_t version, uint64_t digest,
                        std::unordered_map<std::string, at::Tensor> tensors);

  Status health() const;
  // The engine, for its options, stats, version and weight updates.
  rollout::Engine& engine() { return *engine_; }
  // Requests in flight (submitted, not yet done).
  int in_flight() const;

 private:
  void run();
  void on_tokens(std::vector<rollout::SampledToken> tokens);

  std::unique_ptr<rollout::Engine> engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<GroupListener>> listeners_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool step_once_ ABSL_GUARDED_BY(mu_) = false;  // update_weights: a version to apply
  Status failed_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace relay::serve
