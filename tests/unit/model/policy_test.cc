#include "relay/model/policy.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <set>
#include <string>

#include "relay/model/rope.h"
#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

using relay::testing::AllClose;
using relay::testing::TinyConfig;

Policy MakePolicy(const PolicyConfig& config, uint64_t seed = 7) {
  Policy p(config);
  init_weights(*p, seed);
  p->eval();
  return p;
}

// Copies every parameter of `from` into the same-named parameter of `to`.
void CopyWeights(Policy& from, Policy& to) {
  torch::NoGradGuard no_grad;
  auto src = from->named_parameters();
  for (auto& item : to->named_parameters()) item.value().copy_(src[item.key()]);
}

std::set<std::string> Names(Policy& p) {
  std::set<std::string> names;
  for (const auto& item : p->named_parameters()) names.insert(item.key());
  return names;
}

TEST(PolicyTest, ParameterNamesFollowHuggingFace) {
  PolicyConfig c = TinyConfig("qwen2");
  c.num_hidden_layers = 1;
  Policy p(c);
  const std::set<std::string> expected = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.q_proj.bias",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.k_proj.bias",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.v_proj.bias",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
      "model.norm.weight",
      "lm_head.weight",
  };
  EXPECT_EQ(Names(p), expected);
  // Shapes as in HF: GQA k/v project to kv_heads * head_dim = 2 * 8.
  auto params = p->named_parameters();
  EXPECT_EQ(params["model.layers.0.self_attn.k_proj.weight"].sizes(), (at::IntArrayRef{16, 32}));
  EXPECT_EQ(params["model.layers.0.self_attn.q_proj.weight"].sizes(), (at::IntArrayRef{32, 32}));
  EXPECT_EQ(params["lm_head.weight"].sizes(), (at::IntArrayRef{37, 32}));
}

TEST(PolicyTest, TiedModelHasNoLmHead) {
  PolicyConfig c = TinyConfig();
  c.tie_word_embeddings = true;
  Policy p(c);
  EXPECT_EQ(Names(p).count("lm_head.weight"), 0u);
  EXPECT_EQ(Names(p).count("model.layers.0.self_attn.q_proj.bias"), 0u);
}

TEST(PolicyTest, RmsNormMatchesHandComputedValues) {
  RMSNorm norm(4, 1e-6);
  {
    torch::NoGradGuard g;
    norm->weight.copy_(torch::tensor({1.0f, 1.0f, 2.0f, 0.5f}));
  }
  at::Tensor x = torch::tensor({{1.0f, 2.0f, 3.0f, 4.0f}});
  // mean(x^2) = 30 / 4 = 7.5
  const double r = 1.0 / std::sqrt(7.5 + 1e-6);
  at::Tensor expected =
      torch::tensor({{1.0 * r, 2.0 * r, 2 * 3.0 * r, 0.5 * 4.0 * r}}, torch::kFloat32);
  EXPECT_TRUE(AllClose(norm(x), expected, 1e-6));
}

TEST(PolicyTest, RopeIsIdentityAtZeroAndRelative) {
  torch::manual_seed(0);
  PolicyConfig c = TinyConfig();
  c.num_attention_heads = 1;
  c.head_dim = 8;
  at::Tensor inv_freq = rope_frequencies(c).inv_freq;
  // inv_freq[i] = 10000^(-2i/8)
  EXPECT_TRUE(
      AllClose(inv_freq, torch::tensor({1.0, 0.1, 0.01, 0.001}, torch::kFloat32), 1e-7, 1e-6));
  at::Tensor q = torch::randn({1, 1, 1, 8});
  at::Tensor k = torch::randn({1, 1, 1, 8});
  auto at_pos = [&](const at::Tensor& x, int64_t pos) {
    return apply_rope(x, torch::full({1, 1}, pos, torch::kInt64), inv_freq);
  };
  EXPECT_TRUE(AllClose(at_pos(q, 0), q, 1e-7));
  // <R(m) q, R(n) k> depends on m - n only.
  const double d1 = (at_pos(q, 5) * at_pos(k, 2)).sum().item<double>();
  const double d2 = (at_pos(q, 13) * at_pos(k, 10)).sum().item<double>();
  EXPECT_NEAR(d1, d2, 1e-5);
  const double d3 = (at_pos(q, 13) * at_pos(k, 9)).sum().item<double>();
  EXPECT_GT(std::abs(d1 - d3), 1e-4);
}

TEST(PolicyTest, GroupedAttentionHandExample) {
  // One query, two keys, equal scores -> the output is the mean of the values;
  // with the second key masked it is the first value.
  at::Tensor q = torch::zeros({1, 2, 1, 2});
  at::Tensor k = torch::zeros({1, 1, 2, 2});
  at::Tensor v = torch::tensor({1.0f, 2.0f, 3.0f, 6.0f}).view({1, 1, 2, 2});
  at::Tensor all = torch::ones({1, 1, 1, 2}, torch::kBool);
  at::Tensor out = grouped_attention(q, k, v, all);
  EXPECT_TRUE(AllClose(out, torch::tensor({2.0f, 4.0f, 2.0f, 4.0f}).view({1, 2, 1, 2})));
  at::Tensor first = torch::tensor({true, false}).view({1, 1, 1, 2});
  out = grouped_attention(q, k, v, first);
  EXPECT_TRUE(AllClose(out, torch::tensor({1.0f, 2.0f, 1.0f, 2.0f}).view({1, 2, 1, 2})));
}

TEST(PolicyTest, InitIsDeterministicPerSeed) {
  Policy a = MakePolicy(TinyConfig(), 3), b = MakePolicy(TinyConfig(), 3),
         c = MakePolicy(TinyConfig(), 4);
  auto pb = b->named_parameters(), pc = c->named_parameters();
  bool any_differs = false;
  for (const auto& item : a->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
    any_differs = any_differs || !torch::equal(item.value(), pc[item.key()]);
  }
  EXPECT_TRUE(any_differs);
  EXPECT_TRUE(torch::equal(a->named_parameters()["model.norm.weight"], torch::ones({32})));
}

// A clone is the same model: every weight equal, in the source's dtype (a
// bf16 policy's reference or engine copy used to come out fp32, twice the
// memory and another arithmetic), independent of the source afterwards.
TEST(PolicyTest, CloneKeepsEveryWeightAndItsDtype) {
  Policy p(TinyConfig());
  init_weights(*p, 4);
  p->to(torch::kBFloat16);
  Policy copy = clone_policy(*p);
  const auto a = p->named_parameters();
  for (const auto& item : copy->named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), torch::kBFloat16) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), a[item.key()])) << item.key();
  }
  torch::NoGradGuard no_grad;
  copy->parameters()[0].add_(1);
  EXPECT_FALSE(torch::equal(copy->parameters()[0], p->parameters()[0]));
}

TEST(PolicyTest, ForwardIsCausal) {
  Policy p = MakePolicy(TinyConfig());
  at::Tensor ids = torch::tensor({{1, 5, 9, 2, 7, 3}}, torch::kInt64);
  at::Tensor changed = ids.clone();
  changed[0][4] = 11;
  at::Tensor a = p->forward(ids), b = p->forward(changed);
  EXPECT_TRUE(AllClose(a.narrow(1, 0, 4), b.narrow(1, 0, 4), 1e-6));
  EXPECT_FALSE(AllClose(a.narrow(1, 4, 2), b.narrow(1, 4, 2), 1e-4));
}

TEST(PolicyTest, PaddedBatchScoringEqualsPerSequenceScoring) {
  Policy p = MakePolicy(TinyConfig());
  torch::NoGradGuard g;
  const std::vector<std::vector<int64_t>> seqs = {
      {3, 8, 1, 4, 4}, {2, 9, 30, 11, 6, 5, 12, 1, 7}, {4, 19}};
  const int64_t T = 9;
  at::Tensor ids = torch::full({3, T}, 0, torch::kInt64);  // 0 = padding
  at::Tensor lengths = torch::zeros({3}, torch::kInt64);
  for (int64_t b = 0; b < 3; ++b) {
    for (size_t t = 0; t < seqs[b].size(); ++t) ids[b][t] = seqs[b][t];
    lengths[b] = static_cast<int64_t>(seqs[b].size());
  }
  at::Tensor batch = p->score(ids, lengths);
  at::Tensor logits = p->forward(ids, lengths);
  ASSERT_EQ(batch.sizes(), (at::IntArrayRef{3, T - 1}));
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t n = lengths[b].item<int64_t>();
    at::Tensor alone = torch::tensor(seqs[b], torch::kInt64).view({1, n});
    EXPECT_TRUE(AllClose(batch[b].narrow(0, 0, n - 1), p->score(alone)[0], 1e-5)) << "row " << b;
    EXPECT_TRUE(AllClose(logits[b].narrow(0, 0, n), p->forward(alone)[0], 1e-5)) << "row " << b;
    // Padding positions are 0 (the caller's mask decides; they are not NaN).
    EXPECT_TRUE(batch[b].narrow(0, n - 1, T - n).eq(0).all().item<bool>()) << "row " << b;
  }
}

// Sequence packing: three sequences end to end in one row, and a second
// row holding one sequence and padding, score each sequence as it scores
// alone (positions restart, attention stays inside each sequence); the last
// position of each sequence and the padding give 0, log-probs and entropy.
TEST(PolicyTest, PackedSequencesScoreAsTheyDoAlone) {
  for (const std::string arch : {"llama", "qwen3_moe"}) {
    PolicyConfig c = TinyConfig(arch);
    if (arch == "qwen3_moe") {
      c.head_dim = 8;
      c.num_experts = 6;
      c.num_experts_per_tok = 2;
      c.moe_intermediate_size = 16;
      c.norm_topk_prob = true;
    }
    Policy p = MakePolicy(c);
    torch::NoGradGuard g;
    const std::vector<std::vector<int64_t>> seqs = {
        {3, 8, 1, 4, 4}, {2, 9, 30}, {4, 19, 6, 7}, {5, 5, 1, 2, 3, 4, 11}};
    // Row 0: seqs 0, 1, 2 (12 tokens); row 1: seq 3 and 5 padding positions.
    const int64_t W = 12;
    at::Tensor ids = torch::zeros({2, W}, torch::kInt64);
    at::Tensor starts = torch::arange(W, torch::kInt64).repeat({2, 1});
    std::vector<std::pair<int64_t, int64_t>> where = {{0, 0}, {0, 5}, {0, 8}, {1, 0}};
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto [row, at] = where[i];
      for (size_t t = 0; t < seqs[i].size(); ++t) {
        ids[row][at + static_cast<int64_t>(t)] = seqs[i][t];
        starts[row][at + static_cast<int64_t>(t)] = at;
      }
    }
    ScoreOptions so;
    so.sequence_starts = starts;
    ScoreOutput packed = p->score_with_entropy(ids, torch::tensor({12, 7}), so);
    at::Tensor covered = torch::zeros({2, W - 1}, torch::kBool);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto [row, at] = where[i];
      const int64_t n = static_cast<int64_t>(seqs[i].size());
      ScoreOutput alone = p->score_with_entropy(torch::tensor(seqs[i], torch::kInt64).view({1, n}));
      EXPECT_TRUE(AllClose(packed.logprobs[row].narrow(0, at, n - 1), alone.logprobs[0], 1e-5))
          << arch << " sequence " << i;
      EXPECT_TRUE(AllClose(packed.entropy[row].narrow(0, at, n - 1), alone.entropy[0], 1e-5))
          << arch << " sequence " << i;
      covered[row].narrow(0, at, n - 1).fill_(true);
    }
    EXPECT_TRUE(packed.logprobs.masked_select(covered.logical_not()).eq(0).all().item<bool>())
        << arch << ": " << packed.logprobs;
    EXPECT_TRUE(packed.entropy.masked_select(covered.logical_not()).eq(0).all().item<bool>())
        << arch;
  }
}

TEST(PolicyTest, ScoreEqualsLogSoftmaxOfForwardAtEveryChunking) {
  Policy p = MakePolicy(TinyConfig());
  torch::NoGradGuard g;
  at::Tensor ids = torch::tensor({{1, 5, 9, 2, 7, 3, 30}, {4, 4, 8, 1, 0, 2, 6}}, torch::kInt64);
  for (double temperature : {1.0, 0.7}) {
    at::Tensor z = p->forward(ids).narrow(1, 0, 6) / temperature;
    at::Tensor expected =
        torch::log_softmax(z, -1).gather(2, ids.narrow(1, 1, 6).unsqueeze(2)).squeeze(2);
    for (int64_t chunk : {1, 5, 1024}) {
      ScoreOptions opts;
      opts.temperature = temperature;
      opts.chunk_tokens = chunk;
      EXPECT_TRUE(AllClose(p->score(ids, {}, opts), expected, 1e-5))
          << "temperature " << temperature << " chunk " << chunk;
    }
  }
}

// Entropy per position, -sum p log p of the tempered distribution, computed
// here from the full logits; padding positions are 0 like the log-probs.
TEST(PolicyTest, ScoreWithEntropyMatchesTheFullDistribution) {
  Policy p = MakePolicy(TinyConfig());
  torch::NoGradGuard g;
  at::Tensor ids = torch::tensor({{1, 5, 9, 2, 7, 3}, {4, 4, 8, 0, 0, 0}}, torch::kInt64);
  at::Tensor lengths = torch::tensor({6, 3}, torch::kInt64);
  for (double temperature : {1.0, 0.6}) {
    ScoreOptions opts;
    opts.temperature = temperature;
    opts.chunk_tokens = 4;
    ScoreOutput out = p->score_with_entropy(ids, lengths, opts);
    EXPECT_TRUE(AllClose(out.logprobs, p->score(ids, lengths, opts), 1e-6));
    at::Tensor logp =
        torch::log_softmax(p->forward(ids, lengths).narrow(1, 0, 5) / temperature, -1);
    at::Tensor expected = -(logp.exp() * logp).sum(-1);
    EXPECT_TRUE(AllClose(out.entropy[0], expected[0], 1e-5)) << "temperature " << temperature;
    EXPECT_TRUE(AllClose(out.entropy[1].narrow(0, 0, 2), expected[1].narrow(0, 0, 2), 1e-5));
    EXPECT_TRUE(out.entropy[1].narrow(0, 2, 3).eq(0).all().item<bool>());
    // A distribution over V = 37 tokens has 0 < H <= log 37.
    EXPECT_GT(out.entropy[0].min().item<double>(), 0);
    EXPECT_LE(out.entropy.max().item<double>(), std::log(37.0) + 1e-5);
  }
}

TEST(PolicyTest, ScoreIsDifferentiable) {
  Policy p = MakePolicy(TinyConfig());
  p->train();
  at::Tensor ids = torch::tensor({{1, 5, 9, 2}}, torch::kInt64);
  p->score(ids).sum().backward();
  auto params = p->named_parameters();
  EXPECT_GT(params["model.layers.0.self_attn.q_proj.weight"].grad().abs().sum().item<double>(), 0);
  EXPECT_GT(params["lm_head.weight"].grad().abs().sum().item<double>(), 0);
}

// ScoreOptions::scored: the positions left out score 0 (entropy too) and
// the rest, and every gradient, are those of scoring everything.
TEST(PolicyTest, ScoringSomePositionsGivesTheirScoresAndGradientsAlone) {
  Policy whole = MakePolicy(TinyConfig()), some = MakePolicy(TinyConfig());
  whole->train();
  some->train();
  at::Tensor ids = torch::tensor({{1, 5, 9, 2, 7, 3}, {4, 4, 8, 6, 0, 0}}, torch::kInt64);
  at::Tensor lengths = torch::tensor({6, 4}, torch::kInt64);
  ScoreOptions all;
  all.chunk_tokens = 2;
  ScoreOptions part = all;
  // Row 0: positions 2.. (a response after a 3-token prompt); row 1: one
  // position, and a padding position asked for that still scores 0.
  part.scored = torch::tensor({{0, 0, 1, 1, 1}, {0, 0, 1, 0, 1}}, torch::kBool);
  ScoreOutput want = whole->score_with_entropy(ids, lengths, all);
  ScoreOutput got = some->score_with_entropy(ids, lengths, part);
  at::Tensor read =
      part.scored.logical_and(torch::tensor({{1, 1, 1, 1, 1}, {1, 1, 1, 0, 0}}).gt(0));
  EXPECT_TRUE(AllClose(got.logprobs.masked_select(read), want.logprobs.masked_select(read), 1e-6));
  EXPECT_TRUE(AllClose(got.entropy.masked_select(read), want.entropy.masked_select(read), 1e-6));
  EXPECT_TRUE(got.logprobs.masked_select(read.logical_not()).eq(0).all().item<bool>());
  EXPECT_TRUE(got.entropy.masked_select(read.logical_not()).eq(0).all().item<bool>());

  // A loss that reads only the scored positions has the same gradient.
  at::Tensor weight = torch::rand({2, 5}) * read;
  ((want.logprobs + 0.1 * want.entropy) * weight).sum().backward();
  ((got.logprobs + 0.1 * got.entropy) * weight).sum().backward();
  auto a = whole->named_parameters(), b = some->named_parameters();
  for (const auto& item : a) {
    ASSERT_TRUE(b[item.key()].grad().defined()) << item.key();
    EXPECT_TRUE(AllClose(b[item.key()].grad(), item.value().grad(), 1e-5)) << item.key();
  }
  EXPECT_GT(b["lm_head.weight"].grad().abs().sum().item<double>(), 0);

  ScoreOptions wrong = all;
  wrong.scored = torch::ones({2, 6}, torch::kBool);
  EXPECT_THROW(some->score(ids, lengths, wrong), c10::Error);
}

// Grouped-query attention equals multi-head attention whose k/v heads are
// repeated (transformers' repeat_kv): query head h reads kv head h / 2.
TEST(PolicyTest, GqaEqualsMhaWithRepeatedKvHeads) {
  PolicyConfig gqa_config = TinyConfig();  // 4 heads, 2 kv heads, head_dim 8
  PolicyConfig mha_config = gqa_config;
  mha_config.num_key_value_heads = 4;
  Policy gqa = MakePolicy(gqa_config, 11);
  Policy mha(mha_config);
  {
    torch::NoGradGuard g;
    auto src = gqa->named_parameters();
    for (auto& item : mha->named_parameters()) {
      const std::string& name = item.key();
      if (name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos) {
        // [2 * 8, 32] -> [2, 8, 32] -> repeat each kv head twice -> [4 * 8, 32]
        at::Tensor w = src[name].view({2, 8, -1}).repeat_interleave(2, 0).reshape({32, -1});
        item.value().copy_(w);
      } else {
        item.value().copy_(src[name]);
      }
    }
  }
  mha->eval();
  at::Tensor ids = torch::tensor({{1, 5, 9, 2, 7, 3}}, torch::kInt64);
  EXPECT_TRUE(AllClose(gqa->forward(ids), mha->forward(ids), 1e-5));
}

TEST(PolicyTest, TiedHeadEqualsUntiedHeadHoldingTheEmbedding) {
  PolicyConfig tied_config = TinyConfig();
  tied_config.tie_word_embeddings = true;
  Policy tied = MakePolicy(tied_config, 5);
  Policy untied(TinyConfig());
  {
    torch::NoGradGuard g;
    auto src = tied->named_parameters();
    for (auto& item : untied->named_parameters()) {
      const std::string key =
          item.key() == "lm_head.weight" ? "model.embed_tokens.weight" : item.key();
      item.value().copy_(src[key]);
    }
  }
  at::Tensor ids = torch::tensor({{1, 5, 9, 2}}, torch::kInt64);
  EXPECT_TRUE(AllClose(tied->forward(ids), untied->forward(ids), 1e-6));
  // Tying is real sharing: a change to the embedding moves the logits.
  {
    torch::NoGradGuard g;
    tied->model->embed_tokens->weight.mul_(2.0);
  }
  EXPECT_FALSE(AllClose(tied->forward(ids), untied->forward(ids), 1e-3));
}

TEST(PolicyTest, QkvBiasIsAppliedWhenPresent) {
  Policy qwen = MakePolicy(TinyConfig("qwen2"), 9);  // biases initialised to 0
  Policy llama(TinyConfig("llama"));
  CopyWeights(qwen, llama);  // llama has no bias parameters; the rest match
  at::Tensor ids = torch::tensor({{1, 5, 9, 2}}, torch::kInt64);
  EXPECT_TRUE(AllClose(qwen->forward(ids), llama->forward(ids), 1e-6));
  {
    torch::NoGradGuard g;
    qwen->named_parameters()["model.layers.0.self_attn.k_proj.bias"].fill_(0.5);
  }
  EXPECT_FALSE(AllClose(qwen->forward(ids), llama->forward(ids), 1e-4));
}

// LayerHooks (what trainer.sharding: full sets): hooks that really take
// each layer's weights away between uses and keep its gradients when
// gradients_ready says so. The decoder acquires a layer just before it runs
// (again for its recompute in backward), releases it after, and the
// scores and gradients are those of the plain policy.
class SwappingHooks : public LayerHooks {
 public:
  explicit SwappingHooks(PolicyImpl& policy) {
    for (const auto& layer : *policy.model->layers) {
      std::vector<at::Tensor> params = layer->parameters();
      std::vector<at::Tensor> saved;
      for (const at::Tensor& p : params) saved.push_back(p.detach().clone());
      params_.push_back(params);
      saved_.push_back(saved);
      grads_.emplace_back(params.size());
    }
    for (size_t i = 0; i < params_.size(); ++i) release(static_cast<int64_t>(i));
    events.clear();
  }
  void acquire(int64_t layer) override {
    events.push_back("acquire " + std::to_string(layer));
    auto& ps = params_[static_cast<size_t>(layer)];
    for (size_t k = 0; k < ps.size(); ++k) {
      ps[k].set_data(saved_[static_cast<size_t>(layer)][k].clone());
    }
  }
  void release(int64_t layer) override {
    events.push_back("release " + std::to_string(layer));
    for (at::Tensor& p : params_[static_cast<size_t>(layer)]) {
      p.set_data(torch::empty({0}, p.options()));
    }
  }
  void gradients_ready(int64_t layer) override {
    events.push_back("gradients " + std::to_string(layer));
    auto& ps = params_[static_cast<size_t>(layer)];
    for (size_t k = 0; k < ps.size(); ++k) {
      grads_[static_cast<size_t>(layer)][k] = ps[k].grad().clone();
      ps[k].mutable_grad().reset();
    }
    release(layer);
  }
  const at::Tensor& grad(size_t layer, size_t k) const { return grads_[layer][k]; }

  std::vector<std::string> events;

 private:
  std::vector<std::vector<at::Tensor>> params_, saved_, grads_;
};

TEST(PolicyTest, LayerHooksTakeEachLayerOnlyWhileItRunsAndGiveItsGradients) {
  PolicyConfig c = TinyConfig();
  Policy plain(c), swapped(c);
  init_weights(*plain, 11, 0.3);
  init_weights(*swapped, 11, 0.3);
  const at::Tensor ids = torch::randint(0, c.vocab_size, {2, 6}, torch::kInt64);
  const at::Tensor lengths = torch::tensor({6, 4}, torch::kInt64);
  SwappingHooks hooks(*swapped);
  swapped->model->set_layer_hooks(&hooks);
  const int64_t L = c.num_hidden_layers;
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(AllClose(swapped->score(ids, lengths), plain->score(ids, lengths), 0.0));
  }
  std::vector<std::string> expected;
  for (int64_t i = 0; i < L; ++i) {
    expected.push_back("acquire " + std::to_string(i));
    expected.push_back("release " + std::to_string(i));
  }
  EXPECT_EQ(hooks.events, expected);

  hooks.events.clear();
  plain->score(ids, lengths).sum().backward();
  swapped->score(ids, lengths).sum().backward();
  // Forward as before; backward recomputes from the last layer down.
  for (int64_t i = L - 1; i >= 0; --i) {
    expected.push_back("acquire " + std::to_string(i));
    expected.push_back("gradients " + std::to_string(i));
    expected.push_back("release " + std::to_string(i));
  }
  EXPECT_EQ(hooks.events, expected);
  size_t layer = 0;
  for (const auto& l : *plain->model->layers) {
    const auto ps = l->parameters();
    for (size_t k = 0; k < ps.size(); ++k) {
      ASSERT_TRUE(hooks.grad(layer, k).defined());
      EXPECT_TRUE(AllClose(hooks.grad(layer, k), ps[k].grad(), 1e-6)) << "layer " << layer;
    }
    ++layer;
  }
  // The root's own gradients accumulate as usual.
  EXPECT_TRUE(AllClose(swapped->model->embed_tokens->weight.grad(),
                       plain->model->embed_tokens->weight.grad(), 1e-6));
  swapped->model->set_layer_hooks(nullptr);
}

}  // namespace
}  // namespace relay::model
