#pragma once

// The c10d headers, for the two files of relay that talk to c10d directly
// (comm/weight_sync/sync_group.cc and comm/dist/trainer_group.cc); every other
// file reaches a process group through their c10d-free interfaces, because
// these headers are slow to parse. c10d declares its Gloo and NCCL process
// groups only with USE_C10D_GLOO / USE_C10D_NCCL defined, so both files must
// include them the same way: here. Also the one way both make a TCPStore.

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
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>

namespace relay::comm {

// A TCPStore for a rendezvous. LibTorch 2.4 made libuv the store's default
// backend, and a LibTorch built without libuv (Debian's 2.6, some source
// builds) refuses that default in the constructor, server and client alike
// ("use_libuv was requested but PyTorch was build without libuv support";
// PyTorch's own launchers read USE_LIBUV=0 for it). The store is then made
// again with the classic backend, the only one 1.13 has; the two speak the
// same protocol, so either side may fall back alone.
inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(const std::string& host,
                                                         c10d::TCPStoreOptions options) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  if (options.useLibUV) {
    try {
      return c10::make_intrusive<c10d::TCPStore>(host, options);
    } catch (const c10::Error& e) {
      if (std::string(e.what()).find("libuv") == std::string::npos) throw;
      options.useLibUV = false;
    }
  }
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

}  // namespace relay::comm
