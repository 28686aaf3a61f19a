#pragma once

// Weight sync by c10d broadcast: the trainer (rank 0) sends each new version
// to the rollout workers that joined its weight-sync group, Gloo on CPU and
// NCCL on CUDA (builds with RELAY_WITH_CUDA). Workers outside the group, and
// members whose group broke, fetch the version over gRPC (FetchWeights)
// instead; this path is an optimisation, never the only way to get weights.
//
// Protocol. The trainer hosts a c10d TCPStore at endpoint(); all coordination
// goes through its keys, all bytes through the process group.
//
//   relay/backend        "gloo" | "nccl"; a worker whose device disagrees
//                        cannot join (connect fails with FailedPrecondition)
//   req/count, req/<i>   requests, numbered by an atomic counter (add):
//                        "join <name>" (i becomes the member's id) or
//                        "leave <id>"; the trainer reads new ones at the
//                        start of each broadcast()
//   req/<i>/gen          the generation join i was placed in
//   gen/<g>/members      "<id> <name>" per line: ranks 1..n (0 = trainer)
//   gen/<g>/state        counter: broadcasts announced in g, plus 2^40 once
//                        g is closed (one add() reads both)
//   gen/<g>/end          why g closed, written once (compareSet) before the
//                        2^40 is added: "regroup <n>" (after n broadcasts the
//                        members move to g + 1), "broken <reason>" or
//                        "shutdown"
//   gen/<g>/pg/...       the process group's own rendezvous (PrefixStore)
//
// A generation has a fixed member list. broadcast() first reads requests;
// with joins or leaves it closes g with "regroup" (members that are behind
// still drain the broadcasts announced before it), writes g + 1's members,
// and every member of g + 1 builds the group (rendezvous bounded by the
// timeout). Then it announces the broadcast (add 1 to gen/<g>/state) and only
// then enters the collective: workers poll the state counter and enter a
// collective only when one is announced, because a Gloo operation that times
// out leaves its pairs unusable. A regroup needs no collective: a member that
// is dead cannot fail it, and one that is behind finds it in the store.
//
// One broadcast, all rooted at rank 0, issued in this order on every rank:
//   header    int64[kSyncHeaderWords] (weight_buckets.h)
//   manifest  uint8[manifest_bytes], relay.v1.WeightManifest: the receiver
//             checks every byte against the manifest's names, shapes, dtypes
//             and digest without gRPC, and a new member needs nothing else
//   checksums int64[ceil(total / block_bytes)]: the XXH3-64 of each checksum
//             block (1 MiB), computed by WeightPublisher::publish while it
//             copied the weights, so the trainer hashes nothing here
//   buckets   uint8[bucket_bytes] each (the last shorter): the tensors' bytes
//             in manifest order, slices of the snapshot's one payload buffer
//             (no copy), two in flight; receivers check each block as it
//             lands (a bad one is named with its byte range).
//
// Failure. Any failed collective or rendezvous closes the generation as
// broken, on the trainer and on any member that sees it; the trainer's
// broadcast() returns Unavailable (the caller logs it and goes on training),
// and members return Unavailable from receive(): they fetch the version over
// gRPC, call rejoin(), and are placed in a new generation at the trainer's
// next broadcast. A dead member's closed sockets fail the collective at once
// (15 ms on loopback); a live member that stops receiving fails it after
// `timeout`, whatever the size, because Gloo sends only into a receive the
// peer has posted (1.04 s at a 1 s timeout). A failing broadcast() returns
// within about one timeout; so does a rendezvous that someone misses.
//
// Waiting. c10d 1.13's TCPStore::wait leaves its connection out of step when
// the timeout expires, so nothing here waits on the store: members poll one
// counter (one round trip per poll_interval at most), and each rendezvous
// uses a connection of its own.
//
// NCCL (CUDA builds) uses the same protocol through device buffers. It is
// untested: these machines have a CPU LibTorch, so that path has been neither
// compiled nor run; its timeouts also need NCCL's blocking wait or async
// error handling to be turned on.
//
// Thread-safety: each object is used from one thread at a time.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include <ATen/core/Tensor.h>

#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/common/status.h"
#include "relay/model/weight_manifest.h"

namespace relay::comm {

struct WeightSyncServerOptions {
  // Address workers reach the trainer at; the store listens on every
  // interface, the trainer's Gloo device binds this address.
  std::string host = "127.0.0.1";
  int port = 0;                              // 0 = any free port (see endpoint())
  int64_t bucket_bytes = int64_t{64} << 20;  // bytes per collective; two are in flight
  // Bound on every collective and rendezvous; a dead or late member costs
  // at most this much per broadcast.
  std::chrono::milliseconds timeout{30000};
  // Where the send buffers live: "cpu" = Gloo; "cuda[:i]" = NCCL (CUDA builds).
  std::string device = "cpu";
};

Status validate(const WeightSyncServerOptions& options);

struct BroadcastReport {
  int64_t generation = 0;  // the group it went out in (0 = none: no members)
  int members = 0;         // workers that received it (the trainer not counted)
  uint64_t bytes = 0;      // payload of the version (0 with no members)
  double seconds = 0;      // the whole call, regrouping included
  bool regrouped = false;  // a new generation was formed first
};

// The trainer's side. broadcast() is called from one thread.
class WeightSyncServer {
 public:
  // Hosts the store. Unavailable naming host:port when it cannot listen.
  static StatusOr<std::unique_ptr<WeightSyncServer>> start(const WeightSyncServerOptions& options);
  // Closes the current generation ("shutdown"), so members stop at once.
  ~WeightSyncServer();
  WeightSyncServer(const WeightSyncServer&) = delete;
  WeightSyncServer& operator=(const WeightSyncServer&) = delete;

  std::string endpoint() const;  // "host:port" for WeightSyncClientOptions
  // Sends `snapshot` to the members, forming a new generation first when
  // workers asked to join or leave or the last one broke. Returns at once
  // with members = 0 when nobody is in the group. Unavailable naming the
  // generation, version and what failed when a collective or the
  // rendezvous failed; the generation is then broken and its members rejoin.
  StatusOr<BroadcastReport> broadcast(const WeightSnapshot& snapshot);
  // The current generation (0 = none) and its member count.
  int64_t generation() const;
  int members() const;

 private:
  class Impl;
  explicit WeightSyncServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct WeightSyncClientOptions {
  std::string endpoint;     // WeightSyncServer::endpoint()
  std::string member_name;  // for logs and errors, e.g. the worker id
  // Bound on every collective, the rendezvous and connecting to the store.
  std::chrono::milliseconds timeout{30000};
  // Where received tensors go: "cpu" = Gloo; "cuda[:i]" = NCCL (CUDA builds).
  std::string device = "cpu";
  // Longest gap between two reads of the store while waiting (each read is
  // one round trip): bounds how late a member enters an announced broadcast.
  std::chrono::milliseconds poll_interval{10};
  // Address this worker's Gloo device binds; empty = 127.0.0.1 when the
  // endpoint is a loopback address, else the address of this host's name.
  std::string bind_host;
};

Status validate(const WeightSyncClientOptions& options);

struct ReceivedVersion {
  int64_t version = -1;
  model::WeightManifest manifest;
  // Verified, on options.device. On the CPU they are views of one buffer
  // (a tensor at an offset its dtype cannot be viewed at is a copy); the
  // client receives a later version into that buffer again only once every
  // one of them has been dropped.
  std::unordered_map<std::string, at::Tensor> tensors;
  uint64_t bytes = 0;
  double seconds = 0;  // from entering the broadcast to verified tensors
  int64_t generation = 0;
};

// A worker's side. Not thread-safe: one thread calls receive() and rejoin()
// (the worker runs it in the background). Between two receive() calls it
// must spend less than `timeout`, or the trainer's broadcast fails for all.
class WeightSyncClient {
 public:
  // Connects to the store and asks to join. Unavailable when the store
  // cannot be reached within the timeout; FailedPrecondition when the
  // trainer's backend does not match options.device.
  static StatusOr<std::unique_ptr<WeightSyncClient>> connect(
      const WeightSyncClientOptions& options);
  // Asks to leave (best effort), so the next broadcast regroups without it.
  ~WeightSyncClient();
  WeightSyncClient(const WeightSyncClient&) = delete;
  WeightSyncClient& operator=(const WeightSyncClient&) = delete;

  // Blocks until the next version arrives, joining a generation and
  // following regroups on the way. Cancelled when stop() returns true (it is
  // polled between store reads, not inside a collective). Unavailable when
  // the group broke, the trainer shut down or this worker was not placed in
  // the new generation: fetch over gRPC, then rejoin(). DataLoss naming the
  // bucket when a version arrived corrupted: this worker stays a member;
  // fetch that version over gRPC and call receive() again.
  StatusOr<ReceivedVersion> receive(const std::function<bool()>& stop);
  // Leaves the current generation, if any, and asks to join again; call
  // receive() soon after (the trainer's next broadcast waits for this worker).
  // Unavailable when the store is gone (the trainer ended or restarted):
  // connect() again later.
  Status rejoin();
  // The generation this worker is a member of (0 = none yet or broken).
  int64_t generation() const;

 private:
  class Impl;
  explicit WeightSyncClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace relay::comm
