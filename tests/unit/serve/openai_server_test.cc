// relay's OpenAI endpoint (serve/openai_server.h) end to end on loopback: a
// small random model with a byte-level ChatML tokenizer behind a real
// engine, called over HTTP. The log-probs it returns are the model's own
// (checked against a separate forward pass), streams carry exactly the
// non-streamed tokens, stop strings cut the text, episodes continue their
// tokens, and every refusal has OpenAI's status and body.

#include "relay/serve/openai_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "relay/model/bpe_tokenizer.h"
#include "relay/model/policy.h"
#include "testing/byte_tokenizer_json.h"
#include "testing/core_share.h"
#include "testing/tensor_testing.h"

namespace relay::serve {
namespace {

using nlohmann::json;

constexpr int64_t kEndOfText = 256, kImEnd = 258;

// The tests' tiny model, with the byte-level ChatML vocabulary and room for
// chat prompts.
model::PolicyConfig config() {
  model::PolicyConfig c = relay::testing::TinyConfig();
  c.vocab_size = 259;
  c.max_position_embeddings = 256;
  return c;
}

// One model, engine and server per test, with the test's options.
class Served {
 public:
  explicit Served(ServeOptions options = {},
                  rollout::EngineDtype dtype = rollout::EngineDtype::kModel)
      : policy_(config()) {
    model::init_weights(*policy_, 5, 0.3);
    policy_->eval();
    tokenizer_ = std::make_shared<model::BpeTokenizer>(*model::BpeTokenizer::from_json(
        relay::testing::byte_tokenizer_json({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}).dump(),
        "test"));
    rollout::EngineOptions eo;
    eo.num_slots = 4;
    eo.stop_tokens = {kEndOfText, kImEnd};
    eo.dtype = dtype;
    auto engine = rollout::Engine::create(model::clone_policy(*policy_), eo, 0, 7);
    EXPECT_TRUE(engine.ok()) << engine.status();
    serving_ = std::make_unique<ServingEngine>(*std::move(engine));
    ServedModel m;
    m.tokenizer = tokenizer_;
    m.chat_template = model::ChatTemplate::kChatml;
    m.stop_tokens = eo.stop_tokens;
    m.context = 256;
    options.model_name = "tiny";
    auto server = OpenAiServer::start(options, m, *serving_);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(60, 0);
  }
  ~Served() {
    serving_->stop();
    server_.reset();
  }

  httplib::Client& client() { return *client_; }
  OpenAiServer& server() { return *server_; }
  int port() const { return server_->port(); }
  ServingEngine& engine() { return *serving_; }

  // POST with a JSON body; returns (status, parsed body).
  std::pair<int, json> post(const std::string& path, const json& body,
                            const httplib::Headers& headers = {}) {
    auto res = client_->Post(path.c_str(), headers, body.dump(), "application/json");
    if (!res) return {0, json()};
    last_headers_ = res->headers;
    return {res->status, json::parse(res->body, nullptr, false)};
  }
  std::string header(const std::string& name) const {
    auto it = last_headers_.find(name);
    return it == last_headers_.end() ? "" : it->second;
  }

  // log p(token) of every token after the prompt, from a separate forward
  // pass of the served weights (the fp32 policy, or a copy in `dtype`).
  std::vector<float> score(const std::vector<int64_t>& prompt, const std::vector<int64_t>& out,
                           std::optional<c10::ScalarType> dtype = std::nullopt) {
    torch::NoGradGuard g;
    std::vector<int64_t> ids = prompt;
    ids.insert(ids.end(), out.begin(), out.end());
    model::Policy scorer = policy_;
    if (dtype) {
      scorer = model::clone_policy(*policy_);
      scorer->to(*dtype);
    }
    at::Tensor lp = scorer->score(torch::tensor(ids).view({1, -1}), {}, {})[0];
    std::vector<float> r;
    for (size_t j = 0; j < out.size(); ++j) r.push_back(lp[prompt.size() - 1 + j].item<float>());
    return r;
  }

 private:
  model::Policy policy_;
  std::shared_ptr<model::BpeTokenizer> tokenizer_;
  std::unique_ptr<ServingEngine> serving_;
  std::unique_ptr<OpenAiServer> server_;
  std::unique_ptr<httplib::Client> client_;
  httplib::Headers last_headers_;
};

json chat(std::string text, json extra = json::object()) {
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", std::move(text)}}}},
               {"max_tokens", 24},
               {"seed", 11}};
  body.update(extra);
  return body;
}

std::vector<int64_t> ids_of(const json& a) { return a.get<std::vector<int64_t>>(); }

TEST(OpenAiServerTest, ListsItsModel) {
  Served s;
  auto res = s.client().Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["data"][0]["id"], "tiny");
  EXPECT_EQ(s.client().Get("/health")->body, "ok\n");
  auto missing = s.client().Get("/v1/nothing");
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["code"], "unknown_url");
}

// A version handed to an idle serving engine lands at once: its thread
// steps once for it, so the staged copy is not held beside the weights until
// the next request (an agent worker also waits for it before its next
// download). A bad update is refused at the call, as Engine's is.
TEST(OpenAiServerTest, AnIdleServingEngineAppliesAVersionAtOnce) {
  Served s;
  model::Policy next(config());
  model::init_weights(*next, 6, 0.3);
  std::unordered_map<std::string, at::Tensor> weights;
  for (auto& [name, t] : model::parameter_tensors(*next)) weights[name] = t.detach().clone();
  const at::Tensor held = weights.at("model.norm.weight");
  ASSERT_TRUE(s.engine().update_weights(1, 8, std::move(weights)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s.engine().engine().version() != 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(s.engine().engine().version(), 1);
  EXPECT_EQ(s.engine().engine().stats().updates_applied, 1);
  EXPECT_EQ(held.use_count(), 1) << "the staged copy is released once applied";
  EXPECT_FALSE(s.engine().update_weights(2, 9, {}).ok()) << "names no parameter";
  // And it still serves.
  auto [status, body] =
      s.post("/v1/chat/completions", {{"model", "tiny"},
                                      {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                      {"max_tokens", 3}});
  ASSERT_EQ(status, 200) << body.dump();
}

// n choices, each with token ids, versions and log-probs equal to the
// model's log p(token) at temperature 1 (what `relay score` prints).
TEST(OpenAiServerTest, ChatReturnsTheModelsOwnLogprobsPerTokenId) {
  Served s;
  auto [status, r] = s.post("/v1/chat/completions",
                            chat("Hi", {{"n", 2}, {"logprobs", true}, {"temperature", 1.0}}));
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["model"], "tiny");
  const std::vector<int64_t> prompt = ids_of(r["prompt_token_ids"]);
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size());
  ASSERT_EQ(r["choices"].size(), 2u);
  int64_t completion = 0;
  for (const json& c : r["choices"]) {
    const std::vector<int64_t> ids = ids_of(c["token_ids"]);
    ASSERT_FALSE(ids.empty());
    completion += static_cast<int64_t>(ids.size());
    const std::vector<float> want = s.score(prompt, ids);
    ASSERT_EQ(c["logprobs"]["content"].size(), ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
      EXPECT_NEAR(c["logprobs"]["content"][j]["logprob"].get<double>(), want[j], 1e-4) << j;
      EXPECT_EQ(c["token_versions"][j], 0);
    }
    const std::string finish = c["finish_reason"];
    if (ids.back() == kImEnd || ids.back() == kEndOfText) {
      EXPECT_EQ(finish, "stop");
    } else {
      EXPECT_EQ(finish, "length");
      EXPECT_EQ(ids.size(), 24u);
    }
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], completion);
  EXPECT_NE(r["choices"][0]["token_ids"], r["choices"][1]["token_ids"]);
  // The same seed samples the same tokens.
  auto [again_status, again] =
      s.post("/v1/chat/completions", chat("Hi", {{"n", 2}, {"temperature", 1.0}}));
  ASSERT_EQ(again_status, 200);
  EXPECT_EQ(again["choices"][0]["token_ids"], r["choices"][0]["token_ids"]);
  EXPECT_TRUE(again["choices"][0]["logprobs"].is_null());
}

// `relay serve` with rollout.dtype bfloat16: the engine holds bf16 weights,
// and the log-probs a client gets are the bf16 model's, not the fp32 one's
// it was made from (a bf16 rounding step of these logits is up to 0.125).
TEST(OpenAiServerTest, ABf16EngineServesTheBf16ModelsLogprobs) {
  Served s({}, rollout::EngineDtype::kBFloat16);
  auto [status, r] = s.post("/v1/chat/completions",
                            chat("Hi", {{"n", 2}, {"logprobs", true}, {"temperature", 1.0}}));
  ASSERT_EQ(status, 200) << r.dump();
  const std::vector<int64_t> prompt = ids_of(r["prompt_token_ids"]);
  double to_bf16 = 0, to_fp32 = 0;
  int64_t n = 0;
  for (const json& c : r["choices"]) {
    const std::vector<int64_t> ids = ids_of(c["token_ids"]);
    ASSERT_FALSE(ids.empty());
    ASSERT_EQ(c["logprobs"]["content"].size(), ids.size());
    const std::vector<float> bf16 = s.score(prompt, ids, torch::kBFloat16);
    const std::vector<float> fp32 = s.score(prompt, ids);
    for (size_t j = 0; j < ids.size(); ++j) {
      const double got = c["logprobs"]["content"][j]["logprob"].get<double>();
      EXPECT_LE(got, 0.0) << j;
      to_bf16 = std::max(to_bf16, std::fabs(got - bf16[j]));
      to_fp32 += std::fabs(got - fp32[j]);
      ++n;
    }
  }
  std::printf(
      "bf16 engine over HTTP: max |diff| to the bf16 model's scoring %.3g, mean to fp32 %.3g\n",
      to_bf16, to_fp32 / n);
  EXPECT_LT(to_bf16, 0.25);
  EXPECT_GT(to_fp32 / n, 1e-4) << "bf16 weights, not the fp32 ones";
  // The same seed samples the same tokens from the bf16 weights.
  auto [again_status, again] =
      s.post("/v1/chat/completions", chat("Hi", {{"n", 2}, {"temperature", 1.0}}));
  ASSERT_EQ(again_status, 200);
  EXPECT_EQ(again["choices"][1]["token_ids"], r["choices"][1]["token_ids"]);
}

// A stop string ends the text before it; the tokens that made it stay.
TEST(OpenAiServerTest, AStopStringCutsTheTextAndEndsTheSample) {
  Served s;
  json full;
  std::string stop;
  for (int seed = 0; seed < 20 && stop.empty(); ++seed) {
    full = s.post("/v1/chat/completions", chat("Hi", {{"seed", seed}, {"max_tokens", 40}})).second;
    const std::vector<int64_t> ids = ids_of(full["choices"][0]["token_ids"]);
    for (size_t j = 2; j + 2 < ids.size() && stop.empty(); ++j) {
      if (ids[j] >= 'a' && ids[j] <= 'z' && ids[j + 1] >= 'a' && ids[j + 1] <= 'z') {
        stop = {static_cast<char>(ids[j]), static_cast<char>(ids[j + 1])};
      }
    }
    if (!stop.empty()) full["seed"] = seed;
  }
  ASSERT_FALSE(stop.empty()) << "no two lowercase letters in a row in 20 responses";
  const std::vector<int64_t> all = ids_of(full["choices"][0]["token_ids"]);
  const std::string content = full["choices"][0]["message"]["content"];
  auto [status, cut] =
      s.post("/v1/chat/completions",
             chat("Hi", {{"seed", full["seed"]}, {"max_tokens", 40}, {"stop", stop}}));
  ASSERT_EQ(status, 200) << cut.dump();
  const std::string text = cut["choices"][0]["message"]["content"];
  EXPECT_EQ(text, content.substr(0, content.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  const std::vector<int64_t> ids = ids_of(cut["choices"][0]["token_ids"]);
  ASSERT_LE(ids.size(), all.size());
  EXPECT_TRUE(std::equal(ids.begin(), ids.end(), all.begin())) << "a prefix of the same sample";
  EXPECT_EQ(static_cast<char>(ids.back()), stop.back()) << "it ends where the stop string does";
}

// Streamed chunks add up to the non-streamed response of the same seed.
TEST(OpenAiServerTest, AStreamCarriesTheSameTokensAndText) {
  Served s;
  auto [status, whole] = s.post("/v1/chat/completions", chat("Hi", {{"logprobs", true}}));
  ASSERT_EQ(status, 200);
  std::string body;
  auto res = s.client().Post(
      "/v1/chat/completions",
      chat("Hi",
           {{"logprobs", true}, {"stream", true}, {"stream_options", {{"include_usage", true}}}})
          .dump(),
      "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  std::vector<json> chunks;
  bool done = false;
  size_t at = 0;
  while ((at = res->body.find("data: ", at)) != std::string::npos) {
    const size_t end = res->body.find("\n\n", at);
    const std::string data = res->body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
      break;
    }
    chunks.push_back(json::parse(data));
  }
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 3u);
  EXPECT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunks.front()["prompt_token_ids"], whole["prompt_token_ids"]);
  std::string text;
  std::vector<int64_t> ids;
  std::vector<double> logprobs;
  std::string finish;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    const json& c = chunks[i]["choices"][0];
    EXPECT_EQ(chunks[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(chunks[i]["id"], chunks[0]["id"]);
    if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    for (int64_t id : ids_of(c["token_ids"])) ids.push_back(id);
    if (!c["logprobs"].is_null()) {
      for (const json& e : c["logprobs"]["content"]) logprobs.push_back(e["logprob"]);
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  const json& w = whole["choices"][0];
  EXPECT_EQ(text, w["message"]["content"].get<std::string>());
  EXPECT_EQ(ids, ids_of(w["token_ids"]));
  ASSERT_EQ(logprobs.size(), ids.size());
  for (size_t j = 0; j < ids.size(); ++j) {
    EXPECT_EQ(logprobs[j], w["logprobs"]["content"][j]["logprob"].get<double>());
  }
  EXPECT_EQ(finish, w["finish_reason"]);
  const json& usage = chunks.back();
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"], whole["usage"]);
}

TEST(OpenAiServerTest, CompletionsTakeTokenIdsAndDefaultToSixteenTokens) {
  Served s;
  auto [status, r] = s.post(
      "/v1/completions", {{"model", "tiny"}, {"prompt", {72, 105}}, {"seed", 3}, {"logprobs", 0}});
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["prompt_token_ids"], json({72, 105}));
  const std::vector<int64_t> ids = ids_of(r["choices"][0]["token_ids"]);
  EXPECT_LE(ids.size(), 16u);
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"].size(), ids.size());
  const std::vector<float> want = s.score({72, 105}, ids);
  for (size_t j = 0; j < ids.size(); ++j) {
    EXPECT_NEAR(r["choices"][0]["logprobs"]["token_logprobs"][j].get<double>(), want[j], 1e-4);
  }
}

TEST(OpenAiServerTest, RefusalsHaveOpenAisStatusAndBody) {
  Served s;
  auto expect = [&](int status, const std::string& code_or_param, const json& body,
                    const std::string& path = "/v1/chat/completions") {
    auto [got, r] = s.post(path, body);
    EXPECT_EQ(got, status) << body.dump() << " -> " << r.dump();
    ASSERT_TRUE(r.contains("error")) << r.dump();
    const json& e = r["error"];
    EXPECT_TRUE(e["code"] == code_or_param || e["param"] == code_or_param) << r.dump();
    EXPECT_FALSE(e["message"].get<std::string>().empty());
  };
  expect(404, "model_not_found", chat("x", {{"model", "gpt-4"}}));
  expect(400, "temperature", chat("x", {{"temperature", -1}}));
  expect(400, "context_length_exceeded", chat("x", {{"max_tokens", 250}}));
  expect(400, "messages", chat("x<|im_end|>"));
  expect(400, "prompt", {{"model", "tiny"}, {"prompt", {1, 9999}}}, "/v1/completions");
  auto bad = s.client().Post("/v1/chat/completions", "{not json", "application/json");
  EXPECT_EQ(bad->status, 400);

  ServeOptions with_token;
  with_token.token = "secret";
  Served locked(with_token);
  auto [denied, e] = locked.post("/v1/chat/completions", chat("x"));
  EXPECT_EQ(denied, 401);
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  auto [allowed, ok] =
      locked.post("/v1/chat/completions", chat("x"), {{"Authorization", "Bearer secret"}});
  EXPECT_EQ(allowed, 200) << ok.dump();
}

// With one request allowed in flight, a second one meanwhile is told 429; a
// client that goes away mid-stream frees its request and the engine's slots.
// With nothing in flight the engine thread marks the process waiting in its
// core share (model/core_share.h): an agent worker whose episodes are
// between turns leaves the machine's cores to the trainer. It decodes
// marked busy, and waits marked waiting again once the group is done.
TEST(OpenAiServerTest, AnIdleEngineMarksTheProcessWaitingInItsCoreShare) {
  const relay::testing::InstalledCoreShare cores("serve_cores");
  ASSERT_TRUE(cores.busy()) << "a share starts busy";
  {
    Served s;
    EXPECT_TRUE(cores.marked(false)) << "idle, before any request";
    struct Listener : GroupListener {
      const relay::testing::InstalledCoreShare* cores;
      std::atomic<int> tokens{0}, busy_tokens{0};
      std::promise<void> done;
      void on_tokens(const std::vector<rollout::SampledToken>& t) override {
        tokens += static_cast<int>(t.size());
        if (cores->busy()) busy_tokens += static_cast<int>(t.size());
      }
      void on_done(StatusOr<rollout::TrajectoryGroup>) override { done.set_value(); }
    };
    auto listener = std::make_shared<Listener>();
    listener->cores = &cores;
    rollout::PromptGroup g;
    g.group_id = "g";
    g.prompt = {1, 2, 3};
    g.k = 2;
    g.seed = 3;
    ASSERT_TRUE(s.engine().submit(g, listener).ok());
    ASSERT_EQ(listener->done.get_future().wait_for(std::chrono::seconds(60)),
              std::future_status::ready);
    EXPECT_GT(listener->tokens.load(), 0);
    EXPECT_EQ(listener->busy_tokens.load(), listener->tokens.load()) << "decoded marked busy";
    EXPECT_TRUE(cores.marked(false)) << "idle again after the group";
  }
}

TEST(OpenAiServerTest, PastMaxRequestsIs429AndAGoneClientIsDropped) {
  ServeOptions one;
  one.max_requests = 1;
  Served s(one);
  // The stream holds its place until the second request has been answered,
  // then hangs up.
  std::promise<void> streaming, checked;
  std::thread stream([&, checked_future = checked.get_future()]() mutable {
    httplib::Client c("127.0.0.1", s.port());
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = chat("Hi", {{"stream", true}, {"max_tokens", 200}, {"temperature", 2.0}}).dump();
    req.set_header("Content-Type", "application/json");
    bool first = true;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      if (first) {
        first = false;
        streaming.set_value();
        checked_future.wait();
      }
      return false;  // hang up
    };
    c.send(req);
  });
  streaming.get_future().wait();
  auto [status, r] = s.post("/v1/chat/completions", chat("x"));
  checked.set_value();
  EXPECT_EQ(status, 429) << r.dump();
  EXPECT_EQ(r["error"]["code"], "rate_limit_exceeded");
  stream.join();
  // The aborted stream gives its place back.
  for (int i = 0; i < 2000 && s.engine().in_flight() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(s.engine().in_flight(), 0);
  int after = 0;
  for (int i = 0; i < 200 && after != 200; ++i) {
    after = s.post("/v1/chat/completions", chat("x")).first;
    if (after == 429) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(after, 200);
}

// Two calls of one episode: the second continues the first's tokens, and
// ending the episode reports the environment's (the new messages') tokens.
TEST(OpenAiServerTest, AnEpisodeContinuesTokenInTokenOut) {
  Served s;
  const httplib::Headers episode = {{"X-Relay-Episode-Id", "ep-1"}};
  json body = chat("Hi");
  auto [status, first] = s.post("/v1/chat/completions", body, episode);
  ASSERT_EQ(status, 200) << first.dump();
  EXPECT_EQ(s.header("X-Relay-Episode-Continued"), "false");
  EXPECT_EQ(first["episode_id"], "ep-1");
  const json& reply = first["choices"][0]["message"];
  body["messages"].push_back({{"role", "assistant"}, {"content", reply["content"]}});
  body["messages"].push_back({{"role", "user"}, {"content", "And then?"}});
  auto [status2, second] = s.post("/v1/chat/completions", body, episode);
  ASSERT_EQ(status2, 200) << second.dump();
  EXPECT_EQ(s.header("X-Relay-Episode-Continued"), "true");
  std::vector<int64_t> before = ids_of(first["prompt_token_ids"]);
  const std::vector<int64_t> sampled = ids_of(first["choices"][0]["token_ids"]);
  before.insert(before.end(), sampled.begin(), sampled.end());
  const std::vector<int64_t> prompt = ids_of(second["prompt_token_ids"]);
  ASSERT_GT(prompt.size(), before.size());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), prompt.begin()))
      << "the first call's tokens, as sampled, begin the second's prompt";

  auto [n_status, n_error] = s.post("/v1/chat/completions", chat("x", {{"n", 2}}), episode);
  EXPECT_EQ(n_status, 400);
  EXPECT_EQ(n_error["error"]["param"], "n");
  auto [ended_status, ended] = s.post("/v1/episodes/ep-1/end", {{"reward", 0.5}});
  ASSERT_EQ(ended_status, 200) << ended.dump();
  EXPECT_EQ(ended["calls"], 2);
  EXPECT_EQ(ended["env_tokens"], prompt.size() - before.size());
  EXPECT_EQ(ended["reward"], 0.5);
  auto [gone, e] = s.post("/v1/episodes/ep-1/end", json::object());
  EXPECT_EQ(gone, 404);
  EXPECT_EQ(e["error"]["code"], "episode_not_found");
}

// Inside training (serve/episode_source.h): a worker's episodes, as a fake
// source hands them out.
class FakeSource : public EpisodeSource {
 public:
  void offer(EpisodeTicket t) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(t));
  }
  void close() { closed_ = true; }
  StatusOr<std::optional<EpisodeTicket>> take(std::chrono::milliseconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return OutOfRangeError("the run is over: no more episodes");
    if (queue_.empty()) return std::optional<EpisodeTicket>();
    EpisodeTicket t = queue_.front();
    queue_.erase(queue_.begin());
    open_.insert(t.id);
    return std::optional<EpisodeTicket>(t);
  }
  bool is_open(const std::string& id) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return open_.count(id) > 0;
  }
  void end(EndedEpisode e) override {
    std::lock_guard<std::mutex> lock(mu_);
    open_.erase(e.id);
    ended_.push_back(std::move(e));
  }
  std::vector<EndedEpisode> ended() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_;
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> closed_{false};
  std::vector<EpisodeTicket> queue_;
  std::set<std::string> open_;
  std::vector<EndedEpisode> ended_;
};

EpisodeTicket ticket(const std::string& id) {
  EpisodeTicket t;
  t.id = id;
  t.task_id = "arithmetic/3";
  t.messages = {{"user", "What is 6*7?"}};
  t.reference = "42";
  t.group_id = "arithmetic/3#3@e0";
  t.sample = 1;
  t.k = 4;
  t.version = 12;
  return t;
}

TEST(OpenAiServerTest, InsideTrainingEpisodesComeFromTheSourceAndGoBackToIt) {
  Served s;
  auto [no_source, e0] = s.post("/v1/episodes", json::object());
  EXPECT_EQ(no_source, 404) << "relay serve hands out no episodes";
  FakeSource source;
  s.server().set_episode_source(&source);
  source.offer(ticket("ep-a"));
  auto [status, t] = s.post("/v1/episodes", {{"wait_s", 0}});
  ASSERT_EQ(status, 200) << t.dump();
  EXPECT_EQ(t["id"], "ep-a");
  EXPECT_EQ(t["object"], "relay.episode");
  EXPECT_EQ(t["task_id"], "arithmetic/3");
  EXPECT_EQ(t["messages"][0]["content"], "What is 6*7?");
  EXPECT_EQ(t["reference"], "42");
  EXPECT_EQ(t["group_id"], "arithmetic/3#3@e0");
  EXPECT_EQ(t["sample"], 1);
  EXPECT_EQ(t["k"], 4);
  EXPECT_EQ(t["version"], 12);
  EXPECT_EQ(t["model"], "tiny");
  auto none = s.client().Post("/v1/episodes", json{{"wait_s", 0}}.dump(), "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 204) << "nothing to play: ask again";
  auto [bad_wait, bw] = s.post("/v1/episodes", {{"wait_s", 600}});
  EXPECT_EQ(bad_wait, 400);
  EXPECT_EQ(bw["error"]["param"], "wait_s");

  // Only handed-out episodes are played.
  json body = chat("What is 6*7?");
  auto [foreign, f] = s.post("/v1/chat/completions", body, {{"X-Relay-Episode-Id", "ep-made-up"}});
  EXPECT_EQ(foreign, 404);
  EXPECT_EQ(f["error"]["code"], "episode_not_found");
  auto [played, p] = s.post("/v1/chat/completions", body, {{"X-Relay-Episode-Id", "ep-a"}});
  ASSERT_EQ(played, 200) << p.dump();
  auto [end_status, end] = s.post("/v1/episodes/ep-a/end", {{"reward", 1.0}});
  ASSERT_EQ(end_status, 200) << end.dump();
  const std::vector<EndedEpisode> ended = source.ended();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].id, "ep-a");
  EXPECT_EQ(ended[0].trajectory.reward, 1.0);
  EXPECT_EQ(ended[0].trajectory.response_tokens, ids_of(p["choices"][0]["token_ids"]));
  ASSERT_EQ(ended[0].trajectory.turns.size(), 1u);
  EXPECT_EQ(ended[0].trajectory.turns[0].tool_calls, 0);
  auto [again, a] = s.post("/v1/chat/completions", body, {{"X-Relay-Episode-Id", "ep-a"}});
  EXPECT_EQ(again, 404) << "an ended episode takes no more calls";

  source.close();
  auto [over, o] = s.post("/v1/episodes", json::object());
  EXPECT_EQ(over, 410);
  EXPECT_EQ(o["error"]["code"], "run_finished");
}

TEST(OpenAiServerTest, InsideTrainingRequestsSampleAsTheRunDoes) {
  ServeOptions o;
  o.run_sampling = ServeOptions::RunSampling{0.8, 0, 1.0};
  Served s(o);
  auto [same, r] = s.post("/v1/chat/completions", chat("Hi", {{"temperature", 0.8}}));
  EXPECT_EQ(same, 200) << r.dump();
  auto [unset, u] = s.post("/v1/chat/completions", chat("Hi"));
  EXPECT_EQ(unset, 200) << u.dump();
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"temperature", 0.0}, {"temperature", 1.0}, {"top_p", 0.9}, {"top_k", 5}}) {
    auto [status, e] = s.post("/v1/chat/completions", chat("Hi", {{field, value}}));
    EXPECT_EQ(status, 400) << field;
    EXPECT_EQ(e["error"]["param"], field);
    EXPECT_NE(e["error"]["message"].get<std::string>().find("the run's sampling"),
              std::string::npos)
        << e.dump();
  }
  auto [completion, c] =
      s.post("/v1/completions", {{"model", "tiny"}, {"prompt", "ab"}, {"temperature", 0}});
  EXPECT_EQ(completion, 400);
  EXPECT_EQ(c["error"]["param"], "temperature");
}

TEST(OpenAiServerTest, InsideTrainingAnEpisodeKeepsToItsBudget) {
  ServeOptions o;
  o.episode_limits = ServeOptions::EpisodeLimits{/*max_turns=*/2, /*max_tokens=*/40};
  Served s(o);
  const httplib::Headers episode = {{"X-Relay-Episode-Id", "ep-1"}};
  // A turn's max_tokens is cut to what is left of the budget.
  json body = chat("Hi", {{"max_tokens", 200}, {"stop", json::array()}});
  body["messages"][0]["content"] = "Hi";
  auto [first, f] = s.post("/v1/chat/completions", body, episode);
  ASSERT_EQ(first, 200) << f.dump();
  const size_t sampled = f["choices"][0]["token_ids"].size();
  EXPECT_LE(sampled, 40u);
  body["messages"].push_back(
      {{"role", "assistant"}, {"content", f["choices"][0]["message"]["content"]}});
  body["messages"].push_back({{"role", "user"}, {"content", "More."}});
  auto [second, g] = s.post("/v1/chat/completions", body, episode);
  if (second == 200) {
    // Turns and observations together stay within the budget.
    const size_t appended =
        ids_of(g["prompt_token_ids"]).size() - ids_of(f["prompt_token_ids"]).size() - sampled;
    EXPECT_LE(sampled + appended + g["choices"][0]["token_ids"].size(), 40u);
    body["messages"].push_back(
        {{"role", "assistant"}, {"content", g["choices"][0]["message"]["content"]}});
    body["messages"].push_back({{"role", "user"}, {"content", "Again."}});
  } else {
    EXPECT_EQ(g["error"]["code"], "episode_budget_exhausted") << g.dump();
  }
  // A third model turn is past max_turns (or the budget is spent already).
  auto [third, h] = s.post("/v1/chat/completions", body, episode);
  EXPECT_EQ(third, 400);
  EXPECT_EQ(h["error"]["code"], "episode_budget_exhausted") << h.dump();
  // The refused call left the episode as it was: it can still end.
  auto [ended, e] = s.post("/v1/episodes/ep-1/end", json::object());
  EXPECT_EQ(ended, 200) << e.dump();
}

}  // namespace
}  // namespace relay::serve
