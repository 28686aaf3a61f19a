// Which OpenBLAS kernel sets relay replaces, and with what.

#include "relay/model/blas_kernels.h"

#include <gtest/gtest.h>

namespace relay::model {
namespace {

constexpr CpuVectorIsa kSse{};
constexpr CpuVectorIsa kAvx2{true, false, false};
constexpr CpuVectorIsa kAvx2Amd{true, false, true};
constexpr CpuVectorIsa kAvx512{true, true, false};
constexpr CpuVectorIsa kAvx512Amd{true, true, true};

TEST(BlasKernelsTest, AFallbackOnACpuWithAvx512GetsTheSkylakeXKernels) {
  // OpenBLAS 0.3.21 on an Emerald Rapids guest (family 6, model 207).
  EXPECT_EQ(openblas_core_to_request("Prescott", kAvx512), "SkylakeX");
  EXPECT_EQ(openblas_core_to_request("Nehalem", kAvx512), "SkylakeX");
  EXPECT_EQ(openblas_core_to_request("Barcelona", kAvx512Amd), "SkylakeX");
}

TEST(BlasKernelsTest, AFallbackOnACpuWithAvx2GetsHaswellOrZenByVendor) {
  EXPECT_EQ(openblas_core_to_request("Prescott", kAvx2), "Haswell");
  EXPECT_EQ(openblas_core_to_request("Sandybridge", kAvx2), "Haswell");
  EXPECT_EQ(openblas_core_to_request("Core2", kAvx2), "Haswell");
  EXPECT_EQ(openblas_core_to_request("Barcelona", kAvx2Amd), "Zen");
  EXPECT_EQ(openblas_core_to_request("Steamroller", kAvx2Amd), "Zen");
}

TEST(BlasKernelsTest, NamesAreMatchedInAnyCase) {
  EXPECT_EQ(openblas_core_to_request("PRESCOTT", kAvx512), "SkylakeX");
  EXPECT_EQ(openblas_core_to_request("opteron_sse3", kAvx2Amd), "Zen");
}

TEST(BlasKernelsTest, SetsWrittenForAvx2OrLaterAreOpenBlassChoice) {
  // Haswell on an AVX-512 CPU may be OpenBLAS's deliberate choice (AVX-512
  // off in the OS, or a CPU where it is slower); it stays.
  for (const char* set :
       {"Haswell", "Zen", "Excavator", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(openblas_core_to_request(set, kAvx512), "") << set;
    EXPECT_EQ(openblas_core_to_request(set, kAvx2), "") << set;
  }
}

TEST(BlasKernelsTest, AnUnknownSetIsNeverReplaced) {
  // A newer OpenBLAS's name for a newer CPU: relay cannot rank it.
  EXPECT_EQ(openblas_core_to_request("GraniteRapids", kAvx512), "");
  EXPECT_EQ(openblas_core_to_request("", kAvx512), "");
}

TEST(BlasKernelsTest, ACpuWithoutAvx2KeepsWhatOpenBlasChose) {
  EXPECT_EQ(openblas_core_to_request("Prescott", kSse), "");
  EXPECT_EQ(openblas_core_to_request("Sandybridge", kSse), "");
}

TEST(BlasKernelsTest, DescribeSaysWhoChoseTheKernels) {
  BlasKernels k;
  EXPECT_EQ(describe(k), "not OpenBLAS");
  k.openblas = true;
  k.config = "OpenBLAS 0.3.21 DYNAMIC_ARCH";
  k.kernels = "SkylakeX";
  EXPECT_EQ(describe(k), "OpenBLAS 0.3.21 DYNAMIC_ARCH: SkylakeX kernels (OpenBLAS's choice)");
  k.detected = "Prescott";
  EXPECT_EQ(describe(k),
            "OpenBLAS 0.3.21 DYNAMIC_ARCH: SkylakeX kernels (relay's choice; OpenBLAS detected "
            "Prescott)");
  k.detected.clear();
  k.from_environment = true;
  EXPECT_EQ(describe(k), "OpenBLAS 0.3.21 DYNAMIC_ARCH: SkylakeX kernels (OPENBLAS_CORETYPE)");
  k.from_environment = false;
  k.kernels = "Prescott";
  k.below_cpu = true;
  EXPECT_NE(describe(k).find("written for an older CPU"), std::string::npos) << describe(k);
}

}  // namespace
}  // namespace relay::model
