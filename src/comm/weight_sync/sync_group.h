#pragma once

// Private to the weight sync (comm/weight_sync/weight_sync.h): the c10d store connection
// and the process group of one generation, behind interfaces free of c10d
// types, so that sync_group.cc is the only file that includes c10d headers.
// Every c10::Error and std::exception is caught here and becomes a Status
// naming the endpoint, key or generation.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"

namespace relay::comm::internal {

// Store keys (the table in comm/weight_sync/weight_sync.h).
inline constexpr int64_t kClosed = int64_t{1} << 40;  // added to gen/<g>/state on close
inline constexpr char kBackendKey[] = "relay/backend";
inline constexpr char kRequestCountKey[] = "req/count";
std::string request_key(int64_t id);                        // req/<id>
std::string placement_key(int64_t id);                      // req/<id>/gen
std::string gen_key(int64_t generation, const char* leaf);  // gen/<g>/<leaf>

// One connection to the weight-sync TCPStore (or, with is_server, the store
// itself plus a connection to it). Never waits on a missing key: c10d 1.13's
// TCPStore::wait with a timeout leaves the connection out of step when it
// times out, so callers poll with add(key, 0) and check().
class SyncStore {
 public:
  static StatusOr<std::unique_ptr<SyncStore>> connect(const std::string& host, int port,
                                                      std::chrono::milliseconds timeout,
                                                      bool is_server);
  ~SyncStore();

  int port() const;
  const std::string& endpoint() const { return endpoint_; }

  StatusOr<int64_t> add(const std::string& key, int64_t delta);
  Status set(const std::string& key, const std::string& value);
  // nullopt when the key is not set (one check, then one get).
  StatusOr<std::optional<std::string>> get_if_set(const std::string& key);
  // Sets key to `desired` when it is unset; returns the value it holds after.
  StatusOr<std::string> set_if_unset(const std::string& key, const std::string& desired);

 private:
  struct Impl;
  SyncStore(std::unique_ptr<Impl> impl, std::string endpoint);
  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
};

// Closes generation g: writes `reason` to gen/<g>/end unless someone closed it
// first, then adds kClosed to its state. Returns the reason that won.
StatusOr<std::string> close_generation(SyncStore& store, int64_t generation,
                                       const std::string& reason);

struct SyncGroupOptions {
  std::string store_host;  // the store the rendezvous goes through
  int store_port = 0;
  int64_t generation = 0;
  int rank = 0;
  int size = 0;
  std::string bind_host;  // Gloo: the address this rank's device binds; empty = Gloo's default
  std::chrono::milliseconds timeout{30000};
  std::string device = "cpu";  // cuda -> NCCL (RELAY_WITH_CUDA), else Gloo
};

class SyncBroadcast;

// The process group of one generation: Gloo or NCCL, rendezvous through a
// connection of its own under PrefixStore("gen/<g>/pg"), so a rendezvous that
// times out cannot disturb the caller's store connection.
class SyncGroup {
 public:
  // Blocks until every rank arrived or the timeout passed (Unavailable).
  static StatusOr<std::unique_ptr<SyncGroup>> create(const SyncGroupOptions& options);
  // Waits for operations still running (each bounded by the timeout).
  ~SyncGroup();

  const at::Device& device() const;
  // Starts broadcasting `wire` (a contiguous tensor on device()) from rank 0,
  // in place on the others. `what` names it in errors.
  StatusOr<std::unique_ptr<SyncBroadcast>> start(at::Tensor wire, std::string what);
  // A host tensor's twin on device(): the tensor itself on the CPU, else a
  // copy (copy = true) or an uninitialised tensor.
  at::Tensor on_wire(const at::Tensor& host, bool copy) const;
  // Copies `wire` back into `host` unless they are the same tensor.
  void to_host(const at::Tensor& wire, at::Tensor& host) const;

 private:
  struct Impl;
  explicit SyncGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One collective in flight.
class SyncBroadcast {
 public:
  ~SyncBroadcast();
  // Blocks until it completed; Unavailable naming it when it failed.
  Status wait();

 private:
  friend class SyncGroup;
  struct Impl;
  explicit SyncBroadcast(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "gloo" for a CPU device, "nccl" for CUDA in a CUDA build; InvalidArgument
// naming `field` otherwise.
StatusOr<std::string> backend_for(const std::string& device, const std::string& field);

// Host/port of "host:port"; InvalidArgument otherwise.
StatusOr<std::pair<std::string, int>> parse_endpoint(const std::string& endpoint);

}  // namespace relay::comm::internal
