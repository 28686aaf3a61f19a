// The model families relay loads (Llama with rope scaling, Qwen2, Qwen3,
// Qwen3-MoE) against an independent naive implementation of transformers'
// modeling code (tests/testing/reference_decoder.h), KV-cache decoding
// against the full forward, MoE dispatch against a dense loop over experts,
// and router replay.

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "relay/model/kv_cache.h"
#include "relay/model/lm_head.h"
#include "relay/model/policy.h"
#include "testing/reference_decoder.h"
#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

using relay::testing::AllClose;
using relay::testing::ReferenceDecoder;
using relay::testing::TinyConfig;

PolicyConfig Qwen3() {
  PolicyConfig c = TinyConfig("qwen3");
  c.head_dim = 16;  // != hidden / heads (32 / 4), as in Qwen3's configs
  c.rms_norm_eps = 1e-6;
  return c;
}

PolicyConfig Qwen3Moe() {
  PolicyConfig c = Qwen3();
  c.model_type = "qwen3_moe";
  c.num_hidden_layers = 3;
  c.num_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 24;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  c.mlp_only_layers = {1};  // layer 1 keeps a dense MLP
  return c;
}

PolicyConfig Llama3Scaled() {
  PolicyConfig c = TinyConfig("llama");
  c.rope_theta = 500000;
  c.rope_scaling.rope_type = "llama3";
  c.rope_scaling.factor = 8;
  c.rope_scaling.low_freq_factor = 1;
  c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_position_embeddings = 16;  // short, so all regimes show up
  c.attention_bias = true;                               // o_proj gets one too
  return c;
}

PolicyConfig Qwen3Yarn() {
  PolicyConfig c = Qwen3();
  c.rope_scaling.rope_type = "yarn";
  c.rope_scaling.factor = 4;
  c.rope_scaling.original_max_position_embeddings = 16;
  return c;
}

// Weights large enough that attention and routing are sharp (random init at
// 0.02 makes every model nearly uniform and hides a wrong rotation or head
// mapping), with every norm weight and bias perturbed as well.
Policy Sharp(const PolicyConfig& c, uint64_t seed = 11) {
  Policy p(c);
  init_weights(*p, seed, /*initializer_range=*/0.35);
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed + 1);
  for (auto& item : p->named_parameters()) {
    item.value().add_(torch::empty(item.value().sizes()).normal_(0.0, 0.1, gen));
  }
  p->eval();
  return p;
}

std::set<std::string> Names(Policy& p) {
  std::set<std::string> names;
  for (const auto& item : p->named_parameters()) names.insert(item.key());
  return names;
}

const std::vector<int64_t> kIds = {3,  17, 5,  30, 2,  9,  21, 14, 8,  33, 1,  26,
                                   12, 7,  19, 4,  29, 11, 6,  35, 10, 23, 16, 0};

class FamilyTest : public ::testing::TestWithParam<std::string> {
 protected:
  PolicyConfig Config() const {
    const std::string& name = GetParam();
    if (name == "llama3_scaled") return Llama3Scaled();
    if (name == "qwen3") return Qwen3();
    if (name == "qwen3_yarn") return Qwen3Yarn();
    if (name == "qwen3_moe") return Qwen3Moe();
    PolicyConfig c = TinyConfig(name);
    return c;
  }
  torch::NoGradGuard no_grad_;
};

TEST_P(FamilyTest, LogitsMatchTheReferenceImplementation) {
  Policy p = Sharp(Config());
  at::Tensor ours = p->forward(torch::tensor(kIds).view({1, -1}))[0];
  at::Tensor ref = ReferenceDecoder(*p).logits(kIds);
  EXPECT_TRUE(AllClose(ours, ref, 2e-4, 1e-4)) << GetParam();
  // The logits are far from flat, so the comparison has teeth.
  EXPECT_GT(ref.std().item<double>(), 0.5);
}

TEST_P(FamilyTest, KvCacheDecodingEqualsTheFullForward) {
  Policy p = Sharp(Config());
  at::Tensor full = p->forward(torch::tensor(kIds).view({1, -1}))[0];
  KVCacheOptions o;
  o.num_slots = 2;
  o.max_seq_len = 32;
  o.block_size = 4;  // several blocks per sequence
  KVCache cache(p->config(), o);
  // Prefill 5 positions, then one token at a time.
  at::Tensor slot = torch::tensor({1}, torch::kInt64);
  ExtendOptions all;
  all.which = ExtendLogits::kAll;
  at::Tensor first =
      p->extend(torch::tensor(std::vector<int64_t>(kIds.begin(), kIds.begin() + 5)).view({1, -1}),
                torch::tensor({5}, torch::kInt64), slot, cache, all);
  EXPECT_TRUE(AllClose(first[0], full.narrow(0, 0, 5), 1e-4)) << GetParam();
  for (size_t t = 5; t < kIds.size(); ++t) {
    at::Tensor step = p->extend(torch::tensor({kIds[t]}).view({1, 1}),
                                torch::tensor({1}, torch::kInt64), slot, cache);
    EXPECT_TRUE(AllClose(step[0], full[t], 1e-4)) << GetParam() << " position " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest,
                         ::testing::Values("llama", "qwen2", "llama3_scaled", "qwen3", "qwen3_yarn",
                                           "qwen3_moe"));

TEST(FamiliesTest, ParameterNamesFollowTransformers) {
  PolicyConfig c = Qwen3Moe();
  c.num_hidden_layers = 2;  // layer 0 sparse, layer 1 dense (mlp_only_layers)
  Policy p(c);
  const std::set<std::string> names = Names(p);
  for (const char* n :
       {"model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
        "model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.0.gate_proj.weight",
        "model.layers.0.mlp.experts.5.down_proj.weight", "model.layers.1.mlp.gate_proj.weight"}) {
    EXPECT_EQ(names.count(n), 1u) << n;
  }
  EXPECT_EQ(names.count("model.layers.1.mlp.gate.weight"), 0u);
  EXPECT_EQ(names.count("model.layers.0.self_attn.q_proj.bias"), 0u);
  auto params = p->named_parameters();
  EXPECT_EQ(params["model.layers.0.self_attn.q_norm.weight"].sizes(), at::IntArrayRef({16}));
  EXPECT_EQ(params["model.layers.0.self_attn.q_proj.weight"].sizes(), at::IntArrayRef({64, 32}));
  EXPECT_EQ(params["model.layers.0.mlp.gate.weight"].sizes(), at::IntArrayRef({6, 32}));
  // Llama with attention_bias: o_proj has one; Qwen2: q/k/v only.
  Policy llama(Llama3Scaled());
  EXPECT_EQ(Names(llama).count("model.layers.0.self_attn.o_proj.bias"), 1u);
  Policy qwen2(TinyConfig("qwen2"));
  EXPECT_EQ(Names(qwen2).count("model.layers.0.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(Names(qwen2).count("model.layers.0.self_attn.v_proj.bias"), 1u);
}

TEST(FamiliesTest, MoeLayersFollowSparseStepAndMlpOnlyLayers) {
  PolicyConfig c = Qwen3Moe();
  c.num_hidden_layers = 6;
  c.decoder_sparse_step = 2;
  c.mlp_only_layers = {3};
  // (i + 1) % 2 == 0 -> 1, 3, 5; 3 is kept dense.
  std::vector<bool> moe;
  for (int64_t i = 0; i < 6; ++i) moe.push_back(c.is_moe_layer(i));
  EXPECT_EQ(moe, std::vector<bool>({false, true, false, false, false, true}));
  EXPECT_EQ(c.num_moe_layers(), 2);
  EXPECT_EQ(c.moe_layer_index(5), 1);
  EXPECT_EQ(c.moe_layer_index(2), -1);
}

TEST(FamiliesTest, RecordedRoutingIsTheReferenceTopK) {
  torch::NoGradGuard no_grad;
  Policy p = Sharp(Qwen3Moe());
  MoeRouting r;
  r.record = true;
  p->hidden_states(torch::tensor(kIds).view({1, -1}), {}, &r);
  ASSERT_EQ(r.chosen.size(), 2u);  // layers 0 and 2
  const ReferenceDecoder ref(*p);
  EXPECT_TRUE(torch::equal(std::get<0>(r.chosen[0].sort(-1)), ref.routing(kIds, 0)));
  EXPECT_TRUE(torch::equal(std::get<0>(r.chosen[1].sort(-1)), ref.routing(kIds, 2)));
  // Both experts of a token are distinct and every expert is used somewhere.
  EXPECT_TRUE(r.chosen[0].select(1, 0).ne(r.chosen[0].select(1, 1)).all().item<bool>());
}

TEST(FamiliesTest, NormTopKProbChangesTheOutput) {
  torch::NoGradGuard no_grad;
  PolicyConfig c = Qwen3Moe();
  Policy normed = Sharp(c);
  c.norm_topk_prob = false;
  Policy raw = Sharp(c);
  at::Tensor ids = torch::tensor(kIds).view({1, -1});
  EXPECT_FALSE(AllClose(normed->forward(ids), raw->forward(ids), 1e-3));
  EXPECT_TRUE(AllClose(raw->forward(ids)[0], ReferenceDecoder(*raw).logits(kIds), 2e-4, 1e-4));
}

TEST(FamiliesTest, ReplayingTheModelsOwnRoutingChangesNothing) {
  torch::NoGradGuard no_grad;
  Policy p = Sharp(Qwen3Moe());
  at::Tensor ids = torch::tensor(kIds).view({1, -1});
  MoeRouting rec;
  rec.record = true;
  at::Tensor plain = p->logits(p->hidden_states(ids, {}, &rec));
  MoeRouting replay;
  replay.recorded = torch::stack(rec.chosen, 1);  // [T, layers, k]
  replay.replay = true;
  at::Tensor replayed = p->logits(p->hidden_states(ids, {}, &replay));
  EXPECT_TRUE(torch::equal(plain, replayed));
  for (const at::Tensor& d : replay.differs) EXPECT_FALSE(d.any().item<bool>());
}

TEST(FamiliesTest, ReplayRoutesToTheRecordedExpertsAndReportsWhereTheyDiffer) {
  torch::NoGradGuard no_grad;
  Policy p = Sharp(Qwen3Moe());
  at::Tensor ids = torch::tensor(kIds).view({1, -1});
  const int64_t T = ids.size(1);
  MoeRouting rec;
  rec.record = true;
  at::Tensor plain = p->logits(p->hidden_states(ids, {}, &rec));
  // Tokens 0-9: their own experts; tokens 10+: experts (e + 1) mod 6, a
  // different set; the last position: not recorded (-1), routed by itself.
  at::Tensor recorded = torch::stack(rec.chosen, 1).clone();
  recorded.narrow(0, 10, T - 10).add_(1).remainder_(6);
  recorded[T - 1].fill_(-1);
  MoeRouting replay;
  replay.recorded = recorded;
  replay.replay = true;
  replay.record = true;
  at::Tensor forced = p->logits(p->hidden_states(ids, {}, &replay));
  // Layer 0's routing happens before any change: its differs flags are
  // exactly the altered rows.
  at::Tensor want = torch::zeros({T}, torch::kBool);
  want.narrow(0, 10, T - 11).fill_(true);
  EXPECT_TRUE(torch::equal(replay.differs[0], want));
  // The experts used are the recorded ones wherever there is a record.
  EXPECT_TRUE(torch::equal(replay.chosen[0].narrow(0, 0, T - 1),
                           recorded.select(1, 0).narrow(0, 0, T - 1)));
  // Positions before 10 see only unchanged tokens (causal): same logits.
  EXPECT_TRUE(AllClose(forced.narrow(1, 0, 10), plain.narrow(1, 0, 10), 1e-5));
  EXPECT_FALSE(AllClose(forced.narrow(1, 10, T - 10), plain.narrow(1, 10, T - 10), 1e-3));
}

TEST(FamiliesTest, ActivationCheckpointingGivesTheSameGradients) {
  for (const PolicyConfig& c : {TinyConfig("qwen2"), Qwen3Moe()}) {
    Policy p = Sharp(c);
    at::Tensor ids = torch::tensor(kIds).view({2, -1});
    at::Tensor lengths = torch::tensor({12, 9}, torch::kInt64);
    auto grads = [&](bool checkpointing) {
      p->zero_grad();
      p->set_activation_checkpointing(checkpointing);
      ScoreOptions so;
      so.temperature = 0.7;
      ScoreOutput out = p->score_with_entropy(ids, lengths, so);
      (out.logprobs.sum() + 0.1 * out.entropy.sum()).backward();
      std::vector<at::Tensor> g;
      for (const at::Tensor& t : p->parameters()) g.push_back(t.grad().clone());
      return g;
    };
    const std::vector<at::Tensor> plain = grads(false), recomputed = grads(true);
    ASSERT_EQ(plain.size(), recomputed.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(AllClose(recomputed[i], plain[i], 1e-5, 1e-4)) << c.model_type << " param " << i;
    }
    p->set_activation_checkpointing(false);
  }
}

TEST(LmHeadTest, ChunkedScoresAndGradientsEqualAutogradOverTheFullLogits) {
  torch::manual_seed(3);
  const int64_t n = 37, H = 16, V = 50;
  at::Tensor hidden = torch::randn({n, H}).requires_grad_(true);
  at::Tensor weight = (torch::randn({V, H}) * 0.5).requires_grad_(true);
  at::Tensor targets = torch::randint(V, {n}, torch::kInt64);
  at::Tensor g_logp = torch::randn({n}), g_ent = torch::randn({n});
  const double tau = 0.8;

  at::Tensor z = torch::matmul(hidden, weight.t()) / tau;
  at::Tensor logp_all = torch::log_softmax(z, -1);
  at::Tensor logp = logp_all.gather(1, targets.view({-1, 1})).squeeze(1);
  at::Tensor ent = -(logp_all.exp() * logp_all).sum(-1);
  auto want = torch::autograd::grad({logp, ent}, {hidden, weight}, {g_logp, g_ent},
                                    /*retain_graph=*/true);

  auto want_logp = torch::autograd::grad({logp}, {hidden, weight}, {g_logp});
  // Every chunk recomputed, the first two of five kept (a budget between two
  // and three chunks), every one kept: the same values and gradients.
  const int64_t chunk_bytes = 8 * V * 4;
  for (int64_t keep : {int64_t{0}, 2 * chunk_bytes + 5, int64_t{1} << 20}) {
    TokenScores s =
        lm_head_token_scores(hidden, weight, targets, tau, /*chunk_tokens=*/8, true, keep);
    EXPECT_TRUE(AllClose(s.logprobs, logp, 1e-5)) << keep;
    EXPECT_TRUE(AllClose(s.entropy, ent, 1e-5)) << keep;
    TokenScores plain =
        lm_head_token_scores(hidden, weight, targets, tau, /*chunk_tokens=*/8, true, 0);
    // Kept or not, the forward values are the same operations.
    EXPECT_TRUE(torch::equal(s.logprobs, plain.logprobs)) << keep;
    auto got = torch::autograd::grad({s.logprobs, s.entropy}, {hidden, weight}, {g_logp, g_ent},
                                     /*retain_graph=*/true);
    EXPECT_TRUE(AllClose(got[0], want[0], 1e-5, 1e-4)) << keep;
    EXPECT_TRUE(AllClose(got[1], want[1], 1e-5, 1e-4)) << keep;
    // The entropy path left the kept buffers as they were: a second
    // backward through the same graph gives the same gradients.
    auto again = torch::autograd::grad({s.logprobs, s.entropy}, {hidden, weight}, {g_logp, g_ent});
    EXPECT_TRUE(torch::equal(again[0], got[0])) << keep;

    // Log-probs alone (no entropy term): the other in-place path of
    // backward, at a chunking that leaves a short last chunk.
    TokenScores only =
        lm_head_token_scores(hidden, weight, targets, tau, /*chunk_tokens=*/7, false, keep);
    auto got_logp = torch::autograd::grad({only.logprobs}, {hidden, weight}, {g_logp});
    EXPECT_TRUE(AllClose(got_logp[0], want_logp[0], 1e-5, 1e-4)) << keep;
    EXPECT_TRUE(AllClose(got_logp[1], want_logp[1], 1e-5, 1e-4)) << keep;
  }
  EXPECT_THROW(lm_head_token_scores(hidden, weight, targets, tau, 8, false, -1), c10::Error);
}

// Chunks sized by the vocabulary: 256 MiB of fp32 logits, within [16, 1024].
TEST(LmHeadTest, ChunkSizeFollowsTheVocabulary) {
  EXPECT_EQ(lm_head_chunk_tokens(151936), 441);
  EXPECT_EQ(lm_head_chunk_tokens(32), 1024);
  EXPECT_EQ(lm_head_chunk_tokens(int64_t{1} << 24), 16);
}

TEST(LmHeadTest, VocabLimitScoresOverTheSupportOnly) {
  torch::NoGradGuard no_grad;
  Policy p = Sharp(TinyConfig("qwen2"));
  at::Tensor ids = torch::tensor({{3, 9, 1, 20, 7}}, torch::kInt64);
  ScoreOptions limited;
  limited.vocab_limit = 25;
  at::Tensor got = p->score(ids, {}, limited);
  at::Tensor logits = p->forward(ids)[0].narrow(1, 0, 25);
  at::Tensor want = torch::log_softmax(logits, -1)
                        .narrow(0, 0, 4)
                        .gather(1, ids[0].narrow(0, 1, 4).view({-1, 1}))
                        .squeeze(1);
  EXPECT_TRUE(AllClose(got[0], want, 1e-5));
  // A target outside the support scores -inf.
  at::Tensor outside = torch::tensor({{3, 30}}, torch::kInt64);
  EXPECT_TRUE(std::isinf(p->score(outside, {}, limited)[0][0].item<float>()));
}

}  // namespace
}  // namespace relay::model
