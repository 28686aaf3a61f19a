#include "relay/serve/openai_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <random>
#include <set>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "relay/common/utf8.h"
#include "relay/serve/choice_text.h"
#include "relay/serve/openai_api.h"

namespace relay::serve {
namespace {

constexpr char kEpisodeHeader[] = "X-Relay-Episode-Id";
constexpr int64_t kCompletionDefaultMaxTokens = 16;  // OpenAI's documented default

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.json(), "application/json");
}

ApiError api_error(int status, std::string message, std::string type, std::string code,
                   std::string param = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

const char* finish_name(rollout::FinishReason r) {
  return r == rollout::FinishReason::kLength ? "length" : "stop";
}

// One request in flight: its choices' text as tokens arrive, what a stream
// has yet to send, and the group once the engine returns it. on_tokens and
// on_done come on the engine thread; the handler thread waits on `cv`.
class Call : public GroupListener {
 public:
  Call(ServingEngine& engine, std::string group_id, int n,
       const std::function<ChoiceText()>& make_text)
      : engine_(engine), group_id_(std::move(group_id)), choices_(n) {
    for (Choice& c : choices_) c.text = std::make_unique<ChoiceText>(make_text());
  }

  void on_tokens(const std::vector<rollout::SampledToken>& tokens) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const rollout::SampledToken& t : tokens) {
      if (t.sample < 0 || t.sample >= static_cast<int>(choices_.size())) continue;
      Choice& c = choices_[t.sample];
      StatusOr<std::string> piece = c.text->token_text(t.token);
      c.pending_tokens.push_back({t.token, piece.ok() ? *piece : "", t.logprob, t.version});
      StatusOr<std::string> text = c.text->add({t.token});
      if (text.ok()) c.pending_text += *text;
      if (c.text->stopped() && !c.stop_sent) {
        // Applied before the next step: the sample draws nothing more.
        c.stop_sent = true;
        (void)engine_.end_sample(group_id_, t.sample, rollout::FinishReason::kStop);
      }
    }
    cv_.notify_all();
  }

  void on_done(StatusOr<rollout::TrajectoryGroup> group) override {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(group);
    cv_.notify_all();
  }

  // Blocks until the group is back.
  StatusOr<rollout::TrajectoryGroup> wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return result_.has_value(); });
    return *result_;
  }

  // Blocks until there is something to stream; returns the deltas (chat or
  // completions JSON is the caller's), and whether the group is done.
  std::vector<ChoiceDelta> next_deltas(bool* done) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      if (result_.has_value()) return true;
      for (const Choice& c : choices_) {
        if (!c.pending_tokens.empty()) return true;
      }
      return false;
    });
    std::vector<ChoiceDelta> out;
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      if (c.pending_tokens.empty() && c.pending_text.empty()) continue;
      ChoiceDelta d;
      d.index = static_cast<int>(i);
      d.text = std::move(c.pending_text);
      d.tokens = std::move(c.pending_tokens);
      c.pending_text.clear();
      c.pending_tokens.clear();
      out.push_back(std::move(d));
    }
    *done = result_.has_value();
    return out;
  }

  // Once done: choice i's final text and calls.
  ChoiceText::Final final_text(int i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return choices_[i].text->finish();
  }
  bool stopped_by_text(int i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return choices_[i].text->stopped();
  }
  const std::string& group_id() const { return group_id_; }

 private:
  struct Choice {
    std::unique_ptr<ChoiceText> text;
    std::vector<TokenInfo> pending_tokens;  // not yet streamed
    std::string pending_text;
    bool stop_sent = false;
  };
  ServingEngine& engine_;
  const std::string group_id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Choice> choices_;
  std::optional<StatusOr<rollout::TrajectoryGroup>> result_;
};

// What a generation request resolved to, for the shared path.
struct Generation {
  bool chat = true;
  SamplingRequest params;
  std::vector<int64_t> prompt;
  bool parse_tools = false;
  std::string episode_id;
  std::vector<env::ConversationMessage> messages;  // chat: for the episode
  std::vector<std::string> tools;
  std::optional<int64_t> budget;  // tokens an episode has left (inside training)
};

// The body of a call that takes one optional field, `key`: empty, or a JSON
// object with that key at most. The field's value when given.
std::variant<std::optional<nlohmann::json>, ApiError> small_body(const std::string& text,
                                                                 const std::string& key) {
  if (text.empty()) return std::optional<nlohmann::json>();
  nlohmann::json body = nlohmann::json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    return bad_request("", "the request body must be a JSON object");
  }
  for (const auto& [k, value] : body.items()) {
    if (k != key) {
      return bad_request(k, absl::StrCat("Unrecognized request argument supplied: ", k));
    }
  }
  if (!body.contains(key)) return std::optional<nlohmann::json>();
  return std::optional<nlohmann::json>(body[key]);
}

}  // namespace

struct OpenAiServer::Impl {
  Impl(ServeOptions o, ServedModel m, ServingEngine& e)
      : options(std::move(o)),
        model(std::move(m)),
        engine(e),
        episodes(options.episodes, model.tokenizer, model.chat_template),
        created(static_cast<int64_t>(std::time(nullptr))) {}

  const ServeOptions options;
  const ServedModel model;
  ServingEngine& engine;
  EpisodeStore episodes;
  const int64_t created;
  httplib::Server server;
  std::thread thread;
  std::atomic<int> in_flight{0};
  std::mutex sink_mu;
  std::function<void(EndedEpisode)> sink;
  std::atomic<EpisodeSource*> source{nullptr};

  void routes();
  // The checks every /v1 call passes: the token, then the engine.
  std::optional<ApiError> admit(const httplib::Request& req) const;
  void chat(const httplib::Request& req, httplib::Response& res);
  void completions(const httplib::Request& req, httplib::Response& res);
  void end_episode(const httplib::Request& req, httplib::Response& res);
  void take_episode(const httplib::Request& req, httplib::Response& res);
  std::optional<ApiError> check_sampling(const SamplingRequest& r) const;
  void generate(Generation g, httplib::Response& res);
  std::optional<ApiError> check_model(const SamplingRequest& r) const;
  rollout::PromptGroup group_of(const Generation& g, const std::string& id,
                                int64_t max_tokens) const;
  void respond(Generation& g, const ResponseHead& head, Call& call, httplib::Response& res);
  void stream(Generation g, ResponseHead head, std::shared_ptr<Call> call, httplib::Response& res);
  void finish_episode(const Generation& g, const rollout::TrajectoryGroup& group,
                      const ChoiceText::Final& text);
};

std::optional<ApiError> OpenAiServer::Impl::admit(const httplib::Request& req) const {
  if (!options.token.empty() &&
      req.get_header_value("Authorization") != "Bearer " + options.token) {
    return api_error(401, "Incorrect or missing API key: send 'Authorization: Bearer <token>'",
                     "invalid_request_error", "invalid_api_key");
  }
  if (Status s = engine.health(); !s.ok()) {
    return api_error(503, absl::StrCat("the engine failed: ", s.message()), "server_error",
                     "engine_failed");
  }
  return std::nullopt;
}

std::optional<ApiError> OpenAiServer::Impl::check_model(const SamplingRequest& r) const {
  if (r.model != options.model_name) {
    return api_error(404,
                     absl::StrCat("The model '", r.model, "' does not exist; this server serves '",
                                  options.model_name, "'"),
                     "invalid_request_error", "model_not_found", "model");
  }
  return std::nullopt;
}

std::optional<ApiError> OpenAiServer::Impl::check_sampling(const SamplingRequest& r) const {
  if (!options.run_sampling) return std::nullopt;
  const ServeOptions::RunSampling& run = *options.run_sampling;
  auto refuse = [](const char* field, const std::string& asked, const std::string& run_value) {
    return bad_request(
        field, absl::StrCat(field, ": ", asked, " differs from the run's sampling (", run_value,
                            "); inside training requests sample as the run does: "
                            "leave it out or send the run's value"));
  };
  if (r.temperature && *r.temperature != run.temperature) {
    return refuse("temperature", absl::StrCat(*r.temperature),
                  absl::StrCat("rollout.temperature ", run.temperature));
  }
  if (r.top_p && *r.top_p != run.top_p) {
    return refuse("top_p", absl::StrCat(*r.top_p), absl::StrCat("rollout.top_p ", run.top_p));
  }
  if (r.top_k && (*r.top_k < 0 ? 0 : *r.top_k) != run.top_k) {
    return refuse("top_k", absl::StrCat(*r.top_k), absl::StrCat("rollout.top_k ", run.top_k));
  }
  return std::nullopt;
}

void OpenAiServer::Impl::routes() {
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    Status s = engine.health();
    res.status = s.ok() ? 200 : 503;
    res.set_content(s.ok() ? "ok\n" : absl::StrCat(s.message(), "\n"), "text/plain");
  });
  server.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (auto e = admit(req)) return send_error(res, *e);
    res.set_content(models_json(options.model_name, created), "application/json");
  });
  server.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { chat(req, res); });
  server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completions(req, res);
  });
  server.Post("/v1/episodes", [this](const httplib::Request& req, httplib::Response& res) {
    take_episode(req, res);
  });
  server.Post(
      R"(/v1/episodes/([^/]+)/end)",
      [this](const httplib::Request& req, httplib::Response& res) { end_episode(req, res); });
  // Anything else: OpenAI's 404 body rather than an empty page.
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404 && res.body.empty()) {
      send_error(res,
                 api_error(404, absl::StrCat("Unknown request URL: ", req.method, " ", req.path),
                           "invalid_request_error", "unknown_url"));
    }
  });
}

void OpenAiServer::Impl::chat(const httplib::Request& req, httplib::Response& res) {
  if (auto e = admit(req)) return send_error(res, *e);
  auto parsed = parse_chat_request(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  ChatRequest& r = std::get<ChatRequest>(parsed);
  if (auto e = check_model(r)) return send_error(res, *e);
  if (auto e = check_sampling(r)) return send_error(res, *e);
  Generation g;
  g.chat = true;
  g.params = r;
  g.parse_tools = !r.tools.empty() && !r.tool_choice_none;
  g.episode_id = req.get_header_value(kEpisodeHeader);
  g.messages = r.messages;
  g.tools = r.tools;
  if (!g.episode_id.empty()) {
    if (r.n != 1) {
      return send_error(res, bad_request("n", "n: must be 1 in an episode (one sequence goes on)"));
    }
    if (EpisodeSource* src = source.load(); src != nullptr && !src->is_open(g.episode_id)) {
      return send_error(res, api_error(404,
                                       absl::StrCat("episode '", g.episode_id,
                                                    "' was not handed out by this worker, or it "
                                                    "ended or expired; take one with POST "
                                                    "/v1/episodes"),
                                       "invalid_request_error", "episode_not_found"));
    }
    StatusOr<EpisodeCall> call = episodes.begin_call(g.episode_id, r.messages, r.tools);
    if (!call.ok()) {
      const Status& s = call.status();
      if (absl::IsFailedPrecondition(s)) {
        return send_error(
            res, api_error(409, std::string(s.message()), "invalid_request_error", "episode_busy"));
      }
      if (absl::IsResourceExhausted(s)) {
        return send_error(
            res, api_error(429, std::string(s.message()), "requests", "too_many_episodes"));
      }
      return send_error(res, bad_request("messages", std::string(s.message())));
    }
    g.prompt = call->prompt;
    if (const auto& lim = options.episode_limits) {
      g.budget = lim->max_tokens - call->response_tokens;
      std::string spent;
      if (call->turns >= lim->max_turns) {
        spent = absl::StrCat("the episode has had its ", lim->max_turns,
                             " model turns (rollout.episode.max_turns)");
      } else if (*g.budget < 1) {
        spent = absl::StrCat("the episode's response holds ", call->response_tokens,
                             " tokens with this call's messages, and its budget is ",
                             lim->max_tokens, " (rollout.episode.max_tokens)");
      }
      if (!spent.empty()) {
        episodes.abandon_call(g.episode_id);
        return send_error(
            res, api_error(400, absl::StrCat(spent, "; end the episode"), "invalid_request_error",
                           "episode_budget_exhausted", "messages"));
      }
    }
    res.set_header("X-Relay-Episode-Continued", call->continued ? "true" : "false");
  } else {
    StatusOr<std::string> text = env::render_conversation(model.chat_template, r.messages, r.tools);
    if (!text.ok()) {
      const std::string m(text.status().message());
      return send_error(res, bad_request(m.rfind("tools", 0) == 0 ? "tools" : "messages", m));
    }
    StatusOr<std::vector<int64_t>> ids = model.tokenizer->encode(*text);
    if (!ids.ok())
      return send_error(res, bad_request("messages", std::string(ids.status().message())));
    g.prompt = *std::move(ids);
  }
  generate(std::move(g), res);
}

void OpenAiServer::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  if (auto e = admit(req)) return send_error(res, *e);
  auto parsed = parse_completion_request(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  CompletionRequest& r = std::get<CompletionRequest>(parsed);
  if (auto e = check_model(r)) return send_error(res, *e);
  if (auto e = check_sampling(r)) return send_error(res, *e);
  if (!req.get_header_value(kEpisodeHeader).empty()) {
    return send_error(res, bad_request("",
                                       "episodes are chat conversations: use "
                                       "/v1/chat/completions with X-Relay-Episode-Id"));
  }
  Generation g;
  g.chat = false;
  g.params = r;
  if (!r.max_tokens) g.params.max_tokens = kCompletionDefaultMaxTokens;
  if (r.prompt_is_ids) {
    const int64_t vocab = model.tokenizer->vocab_size();
    for (size_t i = 0; i < r.prompt_ids.size(); ++i) {
      if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= vocab) {
        return send_error(
            res, bad_request("prompt", absl::StrCat("prompt[", i, "]: token id ", r.prompt_ids[i],
                                                    " outside the vocabulary [0, ", vocab, ")")));
      }
    }
    g.prompt = r.prompt_ids;
  } else {
    StatusOr<std::vector<int64_t>> ids = model.tokenizer->encode(r.prompt);
    if (!ids.ok())
      return send_error(res, bad_request("prompt", std::string(ids.status().message())));
    g.prompt = *std::move(ids);
  }
  generate(std::move(g), res);
}

rollout::PromptGroup OpenAiServer::Impl::group_of(const Generation& g, const std::string& id,
                                                  int64_t max_tokens) const {
  const SamplingRequest& p = g.params;
  rollout::PromptGroup group;
  group.group_id = id;
  group.prompt = g.prompt;
  group.k = p.n;
  group.seed = p.seed ? *p.seed : std::random_device{}() * 0x9E3779B97F4A7C15ull;
  if (p.temperature && *p.temperature == 0) {
    group.sampling.greedy = true;
  } else if (p.temperature) {
    group.sampling.temperature = *p.temperature;
  }
  group.sampling.top_p = p.top_p;
  if (p.top_k) group.sampling.top_k = *p.top_k < 0 ? 0 : *p.top_k;
  group.sampling.max_new_tokens = max_tokens;
  return group;
}

void OpenAiServer::Impl::generate(Generation g, httplib::Response& res) {
  // A request that goes no further leaves its episode as it was.
  auto abandon = [&] {
    if (!g.episode_id.empty()) episodes.abandon_call(g.episode_id);
  };
  const auto prompt_len = static_cast<int64_t>(g.prompt.size());
  const int64_t room = model.context - prompt_len;
  int64_t max_tokens = g.params.max_tokens.value_or(std::min(options.default_max_tokens, room));
  if (g.budget) max_tokens = std::min(max_tokens, *g.budget);
  if (room < 1 || max_tokens > room) {
    abandon();
    return send_error(
        res,
        api_error(
            400,
            absl::StrCat("This model's maximum context length is ", model.context,
                         " tokens. However, you requested ", prompt_len + max_tokens, " tokens (",
                         prompt_len, " in the ", g.chat ? "messages" : "prompt", ", ", max_tokens,
                         " in the completion). Please reduce the length of the ",
                         g.chat ? "messages" : "prompt", " or completion."),
            "invalid_request_error", "context_length_exceeded", g.chat ? "messages" : "prompt"));
  }
  // Counted from here to the last byte sent.
  if (in_flight.fetch_add(1) >= options.max_requests) {
    in_flight.fetch_sub(1);
    abandon();
    return send_error(res, api_error(429,
                                     absl::StrCat(options.max_requests,
                                                  " requests are in flight, the most this server "
                                                  "takes at once; retry later"),
                                     "requests", "rate_limit_exceeded"));
  }
  ResponseHead head;
  head.id = random_id(g.chat ? "chatcmpl-" : "cmpl-");
  head.created = static_cast<int64_t>(std::time(nullptr));
  head.model = options.model_name;
  head.prompt_token_ids = g.prompt;
  head.episode_id = g.episode_id;
  const std::set<int64_t> stops(model.stop_tokens.begin(), model.stop_tokens.end());
  auto call = std::make_shared<Call>(engine, head.id, g.params.n, [&] {
    return ChoiceText(model.tokenizer, g.params.stop, g.parse_tools, stops);
  });
  if (Status s = engine.submit(group_of(g, head.id, max_tokens), call); !s.ok()) {
    in_flight.fetch_sub(1);
    abandon();
    if (absl::IsUnavailable(s)) {
      return send_error(res,
                        api_error(503, std::string(s.message()), "server_error", "unavailable"));
    }
    return send_error(res, bad_request(g.chat ? "messages" : "prompt", std::string(s.message())));
  }
  if (g.params.stream) return stream(std::move(g), std::move(head), std::move(call), res);
  respond(g, head, *call, res);
  in_flight.fetch_sub(1);
}

namespace {

// The choices of a finished group: text, calls, tokens and finish reason.
std::vector<Choice> choices_of(const rollout::TrajectoryGroup& group, const Call& call,
                               const model::Tokenizer& tokenizer,
                               std::vector<ChoiceText::Final>* finals) {
  std::vector<Choice> out;
  for (size_t i = 0; i < group.trajectories.size(); ++i) {
    const rollout::Trajectory& t = group.trajectories[i];
    ChoiceText::Final f = call.final_text(static_cast<int>(i));
    Choice c;
    c.index = static_cast<int>(i);
    c.content = f.content;
    c.tool_calls = f.tool_calls;
    c.finish_reason = !f.tool_calls.empty()                       ? "tool_calls"
                      : call.stopped_by_text(static_cast<int>(i)) ? "stop"
                                                                  : finish_name(t.finish_reason);
    for (size_t j = 0; j < t.response_tokens.size(); ++j) {
      StatusOr<std::string> text = tokenizer.decode({t.response_tokens[j]});
      c.tokens.push_back({t.response_tokens[j], text.ok() ? *text : "", t.behavior_logprobs[j],
                          t.token_versions[j]});
    }
    out.push_back(std::move(c));
    finals->push_back(std::move(f));
  }
  return out;
}

Usage usage_of(const std::vector<int64_t>& prompt, const std::vector<Choice>& choices) {
  Usage u;
  u.prompt_tokens = static_cast<int64_t>(prompt.size());
  for (const Choice& c : choices) u.completion_tokens += static_cast<int64_t>(c.tokens.size());
  return u;
}

bool aborted(const rollout::TrajectoryGroup& group, const Call& call) {
  for (size_t i = 0; i < group.trajectories.size(); ++i) {
    if (group.trajectories[i].finish_reason == rollout::FinishReason::kAborted &&
        !call.stopped_by_text(static_cast<int>(i))) {
      return true;
    }
  }
  return false;
}

}  // namespace

void OpenAiServer::Impl::respond(Generation& g, const ResponseHead& head, Call& call,
                                 httplib::Response& res) {
  StatusOr<rollout::TrajectoryGroup> group = call.wait();
  if (!group.ok() || aborted(*group, call)) {
    if (!g.episode_id.empty()) episodes.abandon_call(g.episode_id);
    return send_error(
        res, api_error(503,
                       group.ok() ? "the server is stopping"
                                  : absl::StrCat("the engine failed: ", group.status().message()),
                       "server_error", "unavailable"));
  }
  std::vector<ChoiceText::Final> finals;
  std::vector<Choice> choices = choices_of(*group, call, *model.tokenizer, &finals);
  const Usage usage = usage_of(g.prompt, choices);
  if (!g.episode_id.empty()) finish_episode(g, *group, finals.at(0));
  res.set_content(g.chat ? chat_completion_json(head, choices, usage, g.params.logprobs)
                         : completion_json(head, choices, usage, g.params.logprobs),
                  "application/json");
}

void OpenAiServer::Impl::finish_episode(const Generation& g, const rollout::TrajectoryGroup& group,
                                        const ChoiceText::Final& text) {
  env::ConversationMessage reply;
  reply.role = "assistant";
  // As the client reads it: bytes that are not UTF-8 arrive as U+FFFD, and
  // a later call repeats them so.
  reply.content = replace_invalid_utf8(text.content.value_or(""));
  for (const ResponseToolCall& c : text.tool_calls) {
    // As a later request repeats it: arguments parsed and written compactly.
    nlohmann::ordered_json args = nlohmann::ordered_json::parse(c.arguments, nullptr, false);
    reply.tool_calls.push_back({c.name, args.is_discarded() ? c.arguments : args.dump()});
  }
  episodes.finish_call(g.episode_id, group.trajectories.at(0), std::move(reply));
}

void OpenAiServer::Impl::stream(Generation g, ResponseHead head, std::shared_ptr<Call> call,
                                httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  auto started = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, g, head, call, started](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& text) { return sink.write(text.data(), text.size()); };
        auto chunk = [&](const ChoiceDelta& d) {
          return send(sse_event(g.chat ? chat_chunk_json(head, d, g.params.logprobs)
                                       : completion_chunk_json(head, d, g.params.logprobs)));
        };
        auto gone = [&] {
          // The client went away: free its slots now.
          (void)engine.end_sample(call->group_id(), -1, rollout::FinishReason::kAborted);
          return false;
        };
        if (!*started) {
          // Each choice opens with a chunk of its own: the role (chat) and
          // the prompt's token ids.
          *started = true;
          for (int i = 0; i < g.params.n; ++i) {
            ChoiceDelta first;
            first.index = i;
            first.first = true;
            if (!chunk(first)) return gone();
          }
        }
        bool done = false;
        // Each token's text was decoded as it arrived (Call::on_tokens).
        for (const ChoiceDelta& d : call->next_deltas(&done)) {
          if (!chunk(d)) return gone();
        }
        if (!done) return true;
        StatusOr<rollout::TrajectoryGroup> group = call->wait();
        if (!group.ok() || aborted(*group, *call)) {
          if (!g.episode_id.empty()) episodes.abandon_call(g.episode_id);
          send(sse_event(api_error(503,
                                   "the generation was cut short (the server is stopping "
                                   "or the engine failed)",
                                   "server_error", "unavailable")
                             .json()));
        } else {
          std::vector<ChoiceText::Final> finals;
          std::vector<Choice> choices = choices_of(*group, *call, *model.tokenizer, &finals);
          const Usage usage = usage_of(g.prompt, choices);
          for (size_t i = 0; i < choices.size(); ++i) {
            ChoiceDelta last;
            last.index = static_cast<int>(i);
            last.text = finals[i].unsent;
            last.tool_calls = finals[i].tool_calls;
            last.finish_reason = choices[i].finish_reason;
            if (!chunk(last)) return gone();
          }
          if (!g.episode_id.empty()) finish_episode(g, *group, finals.at(0));
          if (g.params.include_usage) send(sse_event(usage_chunk_json(head, g.chat, usage)));
        }
        send(std::string(kSseDone));
        sink.done();
        return true;
      },
      [this](bool) { in_flight.fetch_sub(1); });
}

void OpenAiServer::Impl::end_episode(const httplib::Request& req, httplib::Response& res) {
  if (auto e = admit(req)) return send_error(res, *e);
  const std::string id = req.matches[1];
  auto body = small_body(req.body, "reward");
  if (auto* e = std::get_if<ApiError>(&body)) return send_error(res, *e);
  double reward = std::nan("");
  if (const auto& value = std::get<std::optional<nlohmann::json>>(body)) {
    if (!value->is_null() && (!value->is_number() || !std::isfinite(value->get<double>()))) {
      return send_error(res, bad_request("reward", "reward: must be a finite number or null"));
    }
    if (value->is_number()) reward = value->get<double>();
  }
  StatusOr<EndedEpisode> ended = episodes.end(id, reward);
  if (!ended.ok()) {
    const bool busy = absl::IsFailedPrecondition(ended.status());
    return send_error(
        res, api_error(busy ? 409 : 404, std::string(ended.status().message()),
                       "invalid_request_error", busy ? "episode_busy" : "episode_not_found"));
  }
  const rollout::Trajectory& t = ended->trajectory;
  nlohmann::json out = {
      {"episode_id", id},
      {"calls", ended->calls},
      {"prompt_tokens", t.prompt_tokens.size()},
      {"response_tokens", t.response_tokens.size()},
      {"env_tokens", t.num_env_tokens()},
      {"reward", std::isfinite(reward) ? nlohmann::json(reward) : nlohmann::json()}};
  std::function<void(EndedEpisode)> to;
  {
    std::lock_guard<std::mutex> lock(sink_mu);
    to = sink;
  }
  if (EpisodeSource* src = source.load()) {
    if (to) to(*ended);
    src->end(*std::move(ended));
  } else if (to) {
    to(*std::move(ended));
  }
  res.set_content(out.dump(), "application/json");
}

void OpenAiServer::Impl::take_episode(const httplib::Request& req, httplib::Response& res) {
  if (auto e = admit(req)) return send_error(res, *e);
  EpisodeSource* src = source.load();
  if (src == nullptr) {
    return send_error(res, api_error(404,
                                     "POST /v1/episodes hands out episodes inside training "
                                     "(relay-rollout with rollout.agent); relay serve has none: "
                                     "name your own with X-Relay-Episode-Id",
                                     "invalid_request_error", "unknown_url"));
  }
  // {"wait_s": seconds to wait for one, default 10, at most 60}.
  auto body = small_body(req.body, "wait_s");
  if (auto* e = std::get_if<ApiError>(&body)) return send_error(res, *e);
  double wait_s = 10;
  if (const auto& value = std::get<std::optional<nlohmann::json>>(body)) {
    if (!value->is_number() || value->get<double>() < 0 || value->get<double>() > 60) {
      return send_error(res, bad_request("wait_s", "wait_s: must be a number in [0, 60]"));
    }
    wait_s = value->get<double>();
  }
  StatusOr<std::optional<EpisodeTicket>> t =
      src->take(std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000)));
  if (!t.ok()) {
    // The run is over: agents stop.
    return send_error(
        res,
        api_error(absl::IsOutOfRange(t.status()) ? 410 : 503, std::string(t.status().message()),
                  "server_error", absl::IsOutOfRange(t.status()) ? "run_finished" : "unavailable"));
  }
  if (!t->has_value()) {
    res.status = 204;  // none within wait_s: ask again
    return;
  }
  const EpisodeTicket& e = **t;
  nlohmann::json messages = nlohmann::json::array();
  for (const model::ChatMessage& m : e.messages) {
    messages.push_back({{"role", m.role}, {"content", m.content}});
  }
  nlohmann::json out = {{"id", e.id},
                        {"object", "relay.episode"},
                        {"task_id", e.task_id},
                        {"messages", messages},
                        {"reference", e.reference},
                        {"group_id", e.group_id},
                        {"sample", e.sample},
                        {"k", e.k},
                        {"version", e.version},
                        {"model", options.model_name}};
  res.set_content(out.dump(), "application/json");
}

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::start(ServeOptions options, ServedModel model,
                                                            ServingEngine& engine) {
  if (options.max_requests < 1) {
    return InvalidArgumentError(
        absl::StrCat("serve.max_requests: must be >= 1, got ", options.max_requests));
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(model), engine);
  httplib::Server& server = impl->server;
  // Every request in flight holds a thread (a stream writes from it); a few
  // more answer 429 and small calls meanwhile.
  const int threads = impl->options.max_requests + 4;
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const std::string& host = impl->options.host;
  const int port = impl->options.port;
  const int bound = port == 0 ? server.bind_to_any_port(host.c_str())
                              : (server.bind_to_port(host.c_str(), port) ? port : -1);
  if (bound <= 0) {
    return UnavailableError(absl::StrCat("serve: cannot listen on ", host, ":", port));
  }
  impl->routes();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  // httplib 0.11 signals nothing when its loop starts, and a stop() before
  // then is lost: wait for its flag (MetricsEndpoint does the same).
  for (int i = 0; i < 5000 && !raw->server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl), bound));
}

OpenAiServer::~OpenAiServer() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void OpenAiServer::set_episode_source(EpisodeSource* source) { impl_->source.store(source); }

void OpenAiServer::set_episode_sink(std::function<void(EndedEpisode)> sink) {
  std::lock_guard<std::mutex> lock(impl_->sink_mu);
  impl_->sink = std::move(sink);
}

}  // namespace relay::serve
