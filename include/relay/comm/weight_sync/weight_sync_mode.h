#pragma once

// How rollout workers receive new weights (services.weight_sync); no
// LibTorch, so the config layer can name it.

#include "relay/common/name_table.h"

namespace relay::comm {

enum class WeightSyncMode {
  kFetch,      // every worker downloads each version over gRPC (FetchWeights)
  kBroadcast,  // workers join the trainer's c10d group and receive each version by
               // broadcast, fetching only to join or to recover; a worker that cannot
               // join fails
  kAuto,       // broadcast when the worker can join the group, else fetch
};
inline const NameTable<WeightSyncMode> kWeightSyncModeNames{
    "weight sync mode",
    {{"fetch", WeightSyncMode::kFetch},
     {"broadcast", WeightSyncMode::kBroadcast},
     {"auto", WeightSyncMode::kAuto}}};

}  // namespace relay::comm
