#pragma once

// The floating-point precisions a run names in its config, without LibTorch
// (relay/model/device.h turns them into c10::ScalarType).

#include "relay/common/name_table.h"

namespace relay::model {

// model.dtype: the parameters' precision in memory. Spelled as config.json's
// torch_dtype.
enum class Precision { kFloat32, kBFloat16, kFloat16 };
inline const NameTable<Precision> kPrecisionNames{"dtype",
                                                  {{"float32", Precision::kFloat32},
                                                   {"bfloat16", Precision::kBFloat16},
                                                   {"float16", Precision::kFloat16}}};

// run.autocast: forward passes with matrix products in a lower precision
// (softmax and losses stay fp32), or not at all.
enum class Autocast { kNone, kBFloat16, kFloat16 };
inline const NameTable<Autocast> kAutocastNames{"autocast precision",
                                                {{"none", Autocast::kNone},
                                                 {"bfloat16", Autocast::kBFloat16},
                                                 {"float16", Autocast::kFloat16}}};

}  // namespace relay::model
