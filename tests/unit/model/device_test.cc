#include "relay/model/device.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "relay/model/checkpoint.h"

namespace relay::model {
namespace {

TEST(DeviceTest, ParsesDevicesAndNamesTheKeyOnBadOnes) {
  auto cpu = parse_device("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(cpu->is_cpu());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""}) {
    auto d = parse_device(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("run.device: '" + std::string(bad) + "'"),
              std::string::npos)
        << d.status();
  }
  auto cuda = parse_device("cuda", 1);
  if (!cuda_available()) {
    // A CPU-only build (CI) or a machine without a GPU says which.
    ASSERT_FALSE(cuda.ok());
#ifndef RELAY_WITH_CUDA
    EXPECT_NE(cuda.status().message().find("needs a CUDA build"), std::string::npos)
        << cuda.status();
#endif
  } else if (torch::cuda::device_count() > 1) {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_EQ(cuda->index(), 1);  // cuda = cuda:$LOCAL_RANK
  }
}

TEST(DeviceTest, PrecisionsAsTensorTypes) {
  EXPECT_FALSE(autocast_type(Autocast::kNone).has_value());
  EXPECT_EQ(autocast_type(Autocast::kBFloat16), c10::ScalarType::BFloat16);
  EXPECT_EQ(autocast_type(Autocast::kFloat16), c10::ScalarType::Half);
  EXPECT_EQ(scalar_type(Precision::kFloat32), c10::ScalarType::Float);
  EXPECT_EQ(scalar_type(Precision::kBFloat16), c10::ScalarType::BFloat16);
  EXPECT_EQ(scalar_type(Precision::kFloat16), c10::ScalarType::Half);
  // model.dtype is spelled as config.json's torch_dtype, so the two agree.
  for (const auto& entry : kPrecisionNames.entries()) {
    EXPECT_EQ(parse_torch_dtype(entry.name).value(), scalar_type(entry.value)) << entry.name;
  }
}

TEST(DeviceTest, AutocastGuardScopesLowPrecisionMatmuls) {
  const at::Tensor a = torch::randn({4, 8});
  const at::Tensor b = torch::randn({8, 3});
  {
    AutocastGuard none(c10::DeviceType::CPU, std::nullopt);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
  }
  {
    AutocastGuard outer(c10::DeviceType::CPU, c10::ScalarType::BFloat16);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
    {
      AutocastGuard inner(c10::DeviceType::CPU, c10::ScalarType::BFloat16);
      EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
    }
    // The inner scope's end leaves the outer one on.
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
}

}  // namespace
}  // namespace relay::model
