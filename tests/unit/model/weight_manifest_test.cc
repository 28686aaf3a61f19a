#include "relay/model/weight_manifest.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <xxhash.h>

#include <string>

#include "relay/model/policy.h"
#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

TEST(WeightManifestTest, SortedSpecsAndTheDigestOfTheConcatenatedBytes) {
  std::unordered_map<std::string, at::Tensor> t = {
      {"b.weight", torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({2, 2})},
      {"a.bias", torch::tensor({0.5f, -0.5f}).to(torch::kBFloat16)},
  };
  WeightManifest m = weight_manifest(t, 7).value();
  EXPECT_EQ(m.version, 7);
  ASSERT_EQ(m.tensors.size(), 2u);
  EXPECT_EQ(m.tensors[0].name, "a.bias");
  EXPECT_EQ(m.tensors[0].dtype, "BF16");
  EXPECT_EQ(m.tensors[0].num_bytes, 4u);
  EXPECT_EQ(m.tensors[1].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(m.tensors[1].num_bytes, 16u);
  // The digest is XXH3-64 of a.bias's bytes followed by b.weight's.
  std::string bytes(static_cast<const char*>(t["a.bias"].data_ptr()), 4);
  bytes.append(static_cast<const char*>(t["b.weight"].data_ptr()), 16);
  EXPECT_EQ(m.digest, XXH3_64bits(bytes.data(), bytes.size()));
}

TEST(WeightManifestTest, DigestFollowsTheWeightsNotTheMapOrderOrLayout) {
  Policy p(testing::TinyConfig());
  init_weights(*p, 3);
  WeightManifest a = weight_manifest(*p, 0).value();
  WeightManifest again = weight_manifest(*clone_policy(*p), 0).value();
  EXPECT_EQ(a.digest, again.digest);
  EXPECT_EQ(a.tensors.size(), p->named_parameters().size());

  // A transposed (non-contiguous) view of the same values hashes the same as
  // its contiguous copy: bytes are read in row-major order.
  std::unordered_map<std::string, at::Tensor> t1 = {{"w", torch::arange(6.0f).view({2, 3}).t()}};
  std::unordered_map<std::string, at::Tensor> t2 = {
      {"w", torch::arange(6.0f).view({2, 3}).t().contiguous()}};
  EXPECT_EQ(weight_manifest(t1, 0)->digest, weight_manifest(t2, 0)->digest);

  // One changed element changes the digest.
  {
    torch::NoGradGuard g;
    p->named_parameters()["model.norm.weight"][0] += 1e-3;
  }
  EXPECT_NE(weight_manifest(*p, 0)->digest, a.digest);
}

TEST(WeightManifestTest, UnnamedDtypeIsAnErrorNamingTheTensor) {
  std::unordered_map<std::string, at::Tensor> t = {{"c", torch::zeros({2}, torch::kComplexFloat)}};
  auto m = weight_manifest(t, 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(std::string(m.status().message()).rfind("weight manifest: c: ", 0), 0u) << m.status();
}

}  // namespace
}  // namespace relay::model
