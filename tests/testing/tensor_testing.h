#pragma once

// Tensor assertions and tiny model configs shared by the test suites.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <sstream>
#include <string>

#include "relay/model/policy_config.h"

namespace relay::testing {

// Passes when |a - b| <= atol + rtol * |b| everywhere; the failure message
// gives the largest absolute difference and where it is.
inline ::testing::AssertionResult AllClose(const at::Tensor& a, const at::Tensor& b,
                                           double atol = 1e-5, double rtol = 0.0) {
  if (a.sizes() != b.sizes()) {
    std::ostringstream os;
    os << "shapes differ: " << a.sizes() << " vs " << b.sizes();
    return ::testing::AssertionFailure() << os.str();
  }
  if (a.numel() == 0) return ::testing::AssertionSuccess();
  at::Tensor x = a.detach().to(torch::kCPU, torch::kFloat64);
  at::Tensor y = b.detach().to(torch::kCPU, torch::kFloat64);
  at::Tensor diff = (x - y).abs();
  at::Tensor bad = diff.gt(atol + rtol * y.abs()).logical_or(diff.isnan());
  if (!bad.any().item<bool>()) return ::testing::AssertionSuccess();
  const int64_t at_flat = diff.nan_to_num(1e300).flatten().argmax().item<int64_t>();
  std::ostringstream os;
  os << "max |a - b| = " << diff.flatten()[at_flat].item<double>() << " at flat index " << at_flat
     << " (a = " << x.flatten()[at_flat].item<double>()
     << ", b = " << y.flatten()[at_flat].item<double>() << "), atol " << atol << ", rtol " << rtol;
  return ::testing::AssertionFailure() << os.str();
}

// A tiny decoder: fast enough for every test, big enough to have GQA.
inline model::PolicyConfig TinyConfig(const std::string& model_type = "llama") {
  model::PolicyConfig c;
  c.model_type = model_type;
  c.vocab_size = 37;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.attention_bias = model_type == "qwen2";
  return c;
}

}  // namespace relay::testing
