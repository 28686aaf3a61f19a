#pragma once

// The c10d headers, for the two files of relay that talk to c10d directly
// (comm/weight_sync/sync_group.cc and comm/dist/trainer_group.cc); every other
// file reaches a process group through their c10d-free interfaces, because
// these headers are slow to parse. c10d declares its Gloo and NCCL process
// groups only with USE_C10D_GLOO / USE_C10D_NCCL defined, so both files must
// include them the same way: here.

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#ifdef RELAY_WITH_CUDA
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
