// grouped_attention's two implementations (relay/model/layers.h): eager, the
// explicit products, and sdpa, at::scaled_dot_product_attention where the
// LibTorch has it (2.0+). Here (Debian's LibTorch 1.13) only the choice and
// the refusal of sdpa are checked; the agreement tests run wherever a
// LibTorch 2.x builds relay, the GPU machine among them (docs/gpu.md; the
// CUDA half is CudaAttentionTest in tests/unit/cuda).

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <string>
#include <vector>

#include "relay/model/layers.h"
#include "relay/model/policy.h"
#include "testing/attention_agreement.h"
#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

using relay::testing::AllClose;
using relay::testing::TinyConfig;

using relay::testing::AttentionChoiceGuard;

TEST(AttentionImplementationTest, EagerAlwaysAndSdpaWhereTheLibTorchHasIt) {
  AttentionChoiceGuard restore;
  EXPECT_EQ(attention_implementation(),
            sdpa_available() ? AttentionImplementation::kSdpa : AttentionImplementation::kEager)
      << "the default";
  ASSERT_TRUE(set_attention_implementation(AttentionImplementation::kEager));
  EXPECT_EQ(set_attention_implementation(AttentionImplementation::kSdpa), sdpa_available());
  EXPECT_EQ(attention_implementation(),
            sdpa_available() ? AttentionImplementation::kSdpa : AttentionImplementation::kEager)
      << "a refused choice leaves the last one";
  EXPECT_STREQ(attention_implementation_name(AttentionImplementation::kSdpa), "sdpa");
  EXPECT_STREQ(attention_implementation_name(AttentionImplementation::kEager), "eager");
}

// model.attn_implementation, applied at setup: auto takes the best there is,
// eager is always there, sdpa without LibTorch 2.0+ is an error naming the key.
TEST(AttentionImplementationTest, TheConfiguredChoiceIsAppliedOrRefusedByName) {
  AttentionChoiceGuard restore;
  ASSERT_TRUE(apply_attention_choice(AttentionChoice::kEager).ok());
  EXPECT_EQ(attention_implementation(), AttentionImplementation::kEager);
  ASSERT_TRUE(apply_attention_choice(AttentionChoice::kAuto).ok());
  EXPECT_EQ(attention_implementation(),
            sdpa_available() ? AttentionImplementation::kSdpa : AttentionImplementation::kEager);
  ASSERT_TRUE(apply_attention_choice(AttentionChoice::kEager).ok());
  const Status sdpa = apply_attention_choice(AttentionChoice::kSdpa);
  if (sdpa_available()) {
    EXPECT_TRUE(sdpa.ok()) << sdpa;
    EXPECT_EQ(attention_implementation(), AttentionImplementation::kSdpa);
  } else {
    EXPECT_EQ(sdpa.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(sdpa.message()).find("model.attn_implementation"), std::string::npos)
        << sdpa;
    EXPECT_NE(std::string(sdpa.message()).find(TORCH_VERSION), std::string::npos) << sdpa;
    EXPECT_EQ(attention_implementation(), AttentionImplementation::kEager) << "left as it was";
  }
  EXPECT_EQ(kAttentionChoiceNames.parse("sdpa").value(), AttentionChoice::kSdpa);
  EXPECT_FALSE(kAttentionChoiceNames.parse("flash_attention_2").ok());
}

TEST(AttentionImplementationTest, SdpaAgreesWithEagerOnTheCpu) {
  if (!sdpa_available()) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no scaled_dot_product_attention (2.0+)";
  }
  relay::testing::expect_sdpa_agrees_with_eager(torch::kCPU, torch::kFloat32, 1e-5);
}

// The whole model: right-padded rows scored with either implementation give
// the same log-probs (what the trainer recomputes against the engine's).
TEST(AttentionImplementationTest, PolicyLogProbsAgreeAcrossImplementations) {
  if (!sdpa_available()) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no scaled_dot_product_attention (2.0+)";
  }
  AttentionChoiceGuard restore;
  torch::NoGradGuard no_grad;
  Policy policy(TinyConfig("qwen2"));
  init_weights(*policy, 5, 0.3);
  policy->eval();
  at::Tensor ids = torch::randint(0, TinyConfig().vocab_size, {3, 12});
  at::Tensor lengths = torch::tensor({12, 7, 3}, torch::kInt64);
  ASSERT_TRUE(set_attention_implementation(AttentionImplementation::kEager));
  at::Tensor eager = policy->score(ids, lengths);
  ASSERT_TRUE(set_attention_implementation(AttentionImplementation::kSdpa));
  at::Tensor sdpa = policy->score(ids, lengths);
  EXPECT_TRUE(AllClose(sdpa, eager, 1e-5, 1e-5));
}

}  // namespace
}  // namespace relay::model
