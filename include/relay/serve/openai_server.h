#pragma once

// relay's OpenAI-compatible HTTP endpoint (docs/serve.md):
//
//   GET  /v1/models                  the one model served
//   POST /v1/chat/completions        chat, with tools and episodes; stream: true for SSE
//   POST /v1/completions             text (or token ids) in, text out; no template
//   POST /v1/episodes                inside training: the next episode to play
//   POST /v1/episodes/{id}/end       ends an episode, with the agent's reward
//   GET  /health                     "ok" while the engine works
//
// Requests become groups of a ServingEngine (n choices = k samples) with the
// request's own sampling; tokens stream back as they are sampled. Every
// response carries each choice's token ids, behavior log-probs and policy
// versions (serve/openai_api.h). Calls with the X-Relay-Episode-Id header
// are one episode (serve/episodes.h), continued token-in/token-out.
// Inside training an EpisodeSource (serve/episode_source.h) hands episodes
// out, only its ids are served, and requests sample as the run does.
//
// Errors are OpenAI's error bodies: 400 naming the field, 401 without the
// bearer token when one is set, 404 for another model or an unknown
// episode, 409 for a second call into a busy episode, 429 past
// max_requests in flight, 503 once the engine has failed or is stopping.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/chat_template.h"
#include "relay/model/tokenizer.h"
#include "relay/serve/episode_source.h"
#include "relay/serve/episodes.h"
#include "relay/serve/serving_engine.h"

namespace httplib {
class Server;
}

namespace relay::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 0;            // 0 = any free port (see OpenAiServer::port)
  std::string model_name;  // what /v1/models lists and requests must name
  std::string token;       // bearer token every /v1 call must carry; "" = none
  int max_requests = 64;   // requests in flight at once; more are answered 429
  // max_tokens of a chat request that gives none (within the context);
  // completions default to 16, as OpenAI's do.
  int64_t default_max_tokens = 1024;
  EpisodeStoreOptions episodes;
  // Inside training: the run's sampling (rollout.temperature, top_k,
  // top_p). A request may name these values or leave them out; any other
  // is refused with a 400 naming the field, since the trainer's importance
  // ratios take the recorded log-probs as the run's behavior policy.
  struct RunSampling {
    double temperature = 1.0;
    int64_t top_k = 0;
    double top_p = 1.0;
  };
  std::optional<RunSampling> run_sampling;
  // Inside training: an episode's limits (rollout.episode.max_turns, and the
  // run's token budget for an episode's response, turns and observations
  // together). A call past max_turns model turns, or with no token left, is
  // refused (400, code episode_budget_exhausted); a turn's max_tokens is cut
  // to the tokens left.
  struct EpisodeLimits {
    int64_t max_turns = 0;
    int64_t max_tokens = 0;
  };
  std::optional<EpisodeLimits> episode_limits;
};

// What the server must know of the model the engine runs.
struct ServedModel {
  std::shared_ptr<const model::Tokenizer> tokenizer;
  model::ChatTemplate chat_template = model::ChatTemplate::kNone;
  std::vector<int64_t> stop_tokens;  // the engine's (end-of-turn, EOS): never in the text
  int64_t context = 0;               // positions of a sequence: prompt + completion
};

class OpenAiServer {
 public:
  // Listens on options.host:port; Unavailable naming the address when it
  // cannot. `engine` must outlive the server.
  static StatusOr<std::unique_ptr<OpenAiServer>> start(ServeOptions options, ServedModel model,
                                                       ServingEngine& engine);
  // Stops listening and waits for the handlers in progress.
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  int port() const { return port_; }
  // Where ended episodes go (relay-rollout hands them to the trainer); set
  // before the first request. Called on a handler thread.
  void set_episode_sink(std::function<void(EndedEpisode)> sink);
  // Inside training: where episodes come from (POST /v1/episodes) and go;
  // calls under ids it did not hand out are refused (404). Set before the
  // first request; `source` must outlive the server.
  void set_episode_source(EpisodeSource* source);

 private:
  struct Impl;
  OpenAiServer(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace relay::serve
