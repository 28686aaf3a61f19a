// relay score --model DIR --ids 1,2,3: the per-token log-probs of a
// sequence under a model (position t scores token t+1), optionally with the
// logit rows and, for MoE models, the experts each router chose.

#include <torch/types.h>
#include <torch/utils.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "relay/model/checkpoint.h"
#include "relay/model/policy.h"
#include "relay/model/threads.h"

namespace relay::cli {
namespace {

struct ScoreArgs {
  std::string model_dir;
  std::string ids;  // "1,2,3"
  bool json = false;
  bool logits = false;
  double temperature = 1.0;
};

// NaN (a missing value) becomes JSON null rather than a silent number.
nlohmann::json float_list(const at::Tensor& t) {
  nlohmann::json out = nlohmann::json::array();
  at::Tensor c = t.to(torch::kCPU, torch::kFloat64).contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) out.push_back(c.data_ptr<double>()[i]);
  return out;
}

int score(const ScoreArgs& args) {
  // Every core, split as relay's workers split it (model/threads.h).
  model::configure_threads(0);
  std::vector<int64_t> ids;
  std::string error;
  if (!parse_ids(args.ids, &ids, &error)) return fail("score", InvalidArgumentError(error));
  if (ids.size() < 2) {
    return fail("score",
                InvalidArgumentError("ids: need at least 2 tokens (position t scores t+1)"));
  }
  StatusOr<model::Policy> policy = model::load_policy(args.model_dir);
  if (!policy.ok()) return fail("score", policy.status());
  // Past max_position_embeddings the model still computes (RoPE extends),
  // but the numbers are for positions it never saw: refuse, not mislead.
  const int64_t context = (*policy)->config().max_position_embeddings;
  if (static_cast<int64_t>(ids.size()) > context) {
    return fail("score", InvalidArgumentError(absl::StrCat(
                             "ids: ", ids.size(), " tokens exceed the model's context of ", context,
                             " (max_position_embeddings in ", args.model_dir, "/config.json)")));
  }
  const int64_t vocab = (*policy)->config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return fail("score",
                  InvalidArgumentError(absl::StrCat("ids[", i, "]: token id ", ids[i],
                                                    " outside the vocabulary [0, ", vocab, ")")));
    }
  }
  if (!(args.temperature > 0)) {
    return fail("score", InvalidArgumentError(
                             absl::StrCat("temperature: must be > 0, got ", args.temperature)));
  }
  torch::NoGradGuard no_grad;
  at::Tensor input = torch::tensor(ids, torch::kInt64).view({1, -1});
  model::ScoreOptions opts;
  opts.temperature = args.temperature;
  model::MoeRouting routing;
  routing.record = (*policy)->config().num_moe_layers() > 0;
  if (routing.record) opts.routing = &routing;
  at::Tensor logprobs = (*policy)->score(input, {}, opts)[0];
  if (args.json) {
    nlohmann::json out = {{"logprobs", float_list(logprobs)}};
    if (routing.record) {
      // [layer][position][k]: the experts each MoE layer's router chose for
      // the input token at each position.
      nlohmann::json layers = nlohmann::json::array();
      for (const at::Tensor& chosen : routing.chosen) {
        at::Tensor c = chosen.to(torch::kCPU, torch::kInt64).contiguous();
        nlohmann::json positions = nlohmann::json::array();
        for (int64_t t = 0; t < c.size(0); ++t) {
          positions.push_back(
              std::vector<int64_t>(c[t].data_ptr<int64_t>(), c[t].data_ptr<int64_t>() + c.size(1)));
        }
        layers.push_back(std::move(positions));
      }
      out["routing"] = std::move(layers);
    }
    if (args.logits) {
      // One row per position: row t holds the logits that predict token t+1.
      at::Tensor logits = (*policy)->forward(input)[0].to(torch::kFloat32);
      if (args.temperature != 1.0) logits = logits / args.temperature;
      nlohmann::json rows = nlohmann::json::array();
      for (int64_t t = 0; t < logits.size(0); ++t) rows.push_back(float_list(logits[t]));
      out["logits"] = rows;
    }
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::printf("%5s %8s %12s\n", "pos", "token", "logprob");
  for (int64_t t = 0; t < logprobs.size(0); ++t) {
    std::printf("%5lld %8lld %12.6f\n", static_cast<long long>(t + 1),
                static_cast<long long>(ids[t + 1]), logprobs[t].item<double>());
  }
  std::printf("sum %.6f over %lld tokens\n", logprobs.sum().item<double>(),
              static_cast<long long>(logprobs.size(0)));
  return 0;
}

}  // namespace

Command add_score_command(CLI::App& relay) {
  auto args = std::make_shared<ScoreArgs>();
  CLI::App* score = relay.add_subcommand(
      "score", "Per-token log-probs of a sequence: position t scores token t+1");
  score->add_option("--model", args->model_dir, "HF-layout model directory")->required();
  score->add_option("--ids", args->ids, "Token ids, comma-separated")->required();
  score->add_option("--temperature", args->temperature, "Divide logits by this first");
  score->add_flag("--json", args->json, "Print {\"logprobs\": [...]}");
  score->add_flag("--logits", args->logits, "With --json, also print the logit rows");
  return {score, [args] { return cli::score(*args); }};
}

}  // namespace relay::cli
