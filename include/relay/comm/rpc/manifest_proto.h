#pragma once

// model::WeightManifest <-> relay.v1.WeightManifest.

#include "relay/model/weight_manifest.h"

namespace relay::v1 {
class WeightManifest;
}

namespace relay::comm {

void to_proto(const model::WeightManifest& in, v1::WeightManifest* out);
model::WeightManifest from_proto(const v1::WeightManifest& in);

}  // namespace relay::comm
