// Weight delivery to rollout workers on loopback (relay/comm/weight_sync/weight_sync.h):
// one version of a ~100M-parameter model (qwen2-100m of rollout_bench, fp32,
// ~400 MB) from a trainer to C clients, each client a thread of this process.
//
//   tcp    (baseline) the same bytes through plain TCP sockets on 127.0.0.1:
//          one sender thread writes 4 MiB at a time to each client's socket
//          in turn, one receiver thread per client reads into a preallocated
//          (already touched) buffer. No framing, no checks: the floor any
//          network transport on this machine compares against;
//   gloo   c10d ProcessGroupGloo broadcast of the same bytes in buckets of the
//          same size as relay's, two in flight, from one flat buffer into one
//          flat buffer per client: no copies, no checksums, no manifest;
//   relay  WeightSyncServer::broadcast -> WeightSyncClient::receive: header,
//          manifest, the publisher's block checksums, buckets sent as views
//          of the snapshot (or copied where one spans tensors), landed in one
//          payload buffer and verified (each 1 MiB block and the manifest
//          digest), returned as per-tensor views;
//   grpc   the fallback: TrainerService + RpcServer on 127.0.0.1 and C
//          TrainerClient::fetch_weights calls at once (256 KiB chunks, each
//          checksummed, digest checked).
// A row's time runs from the send until every client holds the version;
// GB/s = version bytes / time (what each client gets: with C clients the
// sender moves C times as much); "vs tcp" = tcp time / this row's time (1 =
// as fast as the plain socket copy), "vs gloo" likewise against gloo. Every
// mode is set up once per client count (connections, groups, servers); then
// each repetition runs every mode once, in turn, so drift hits all alike.
// The first repetition is not timed (it warms connections and pages, and
// relay's forms its group). Figures are medians of --reps.
//
// Last, unless --skip-grpc: decoding through a fetched version (see
// fetch_while_decoding), a worker that stops for the download against one
// that fetches on a thread (RolloutWorkerOptions::fetch_in_background).
//
//   weight_sync_bench [--clients 1,2] [--bucket-mb 64,8] [--reps 5] [--fetch-chunk-kb N]
//                     [--decode-batch 8] [--decode-steps 32] [--decode-device cpu|cuda[:i]]
//                     [--skip-grpc] [--cpu-memory keep|return] [--quick] [--json]
// --fetch-chunk-kb: FetchWeights' chunk (default: the trainer's, 256 KiB).
// --decode-batch, --decode-steps: the sequences decoding through the fetch,
// and the steps they must make after the version is announced;
// --decode-device, where the engine decodes them (scripts/gpu/check.sh: cuda,
// where the decode does not share the download's cores).
// --cpu-memory: the process's malloc policy (bench_util.h), keep as relay's
// binaries.
// --quick = --clients 1 --bucket-mb 64 --reps 3. --json prints one JSON object
// per result on stdout and the table on stderr.

#include <spdlog/spdlog.h>
#include <torch/types.h>
#include <torch/utils.h>

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench_util.h"
#include "relay/comm/rpc/grpc_trainer_client.h"
#include "relay/comm/service/trainer_service.h"
#include "relay/comm/weight_sync/weight_buckets.h"
#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/comm/weight_sync/weight_sync.h"
#include "relay/comm/worker/weight_fetcher.h"
#include "relay/model/device.h"
#include "relay/model/policy.h"
#include "relay/model/threads.h"
#include "relay/rollout/engine.h"
#include "relay/store/dispenser.h"
#include "relay/store/rollout_store.h"

namespace {

using relay::bench::Clock;
using relay::bench::median;
using relay::bench::qwen2_100m_config;
using relay::bench::seconds_since;
using namespace relay;
using namespace relay::comm;

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p != '\0';) {
    out.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return out;
}

template <typename T>
T check(StatusOr<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(r.status().message()).c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

std::shared_ptr<const WeightSnapshot> qwen2_100m_snapshot(WeightPublisher& publisher) {
  model::Policy policy(qwen2_100m_config());
  model::init_weights(*policy, 0);
  if (Status s = publisher.publish(1, model::parameter_tensors(*policy)); !s.ok()) std::exit(1);
  return check(publisher.snapshot(1), "snapshot");
}

// ---- what a new version costs the worker's generation loop ----
// The engine stages a version (update_weights) and applies it at its next
// step: one copy into its parameters. That is the whole pause with
// broadcast, where the receive runs on the WeightReceiver's thread; with
// fetch, the loop also waits for FetchWeights itself.
double engine_apply_seconds(const WeightSnapshot& snap, int reps) {
  model::Policy policy(qwen2_100m_config());
  rollout::EngineOptions eo;
  eo.num_slots = 1;
  auto engine = check(rollout::Engine::create(policy, eo, 1, snap.manifest.digest), "engine");
  std::vector<double> times;
  for (int rep = 0; rep < reps + 1; ++rep) {
    std::unordered_map<std::string, at::Tensor> tensors;
    for (size_t i = 0; i < snap.tensors.size(); ++i) {
      tensors[snap.manifest.tensors[i].name] = snap.tensors[i];
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (!engine->update_weights(2 + rep, snap.manifest.digest, std::move(tensors)).ok()) {
      std::exit(1);
    }
    check(engine->step(), "apply");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) times.push_back(s);  // the first touches fresh pages
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// ---- publishing: what the trainer's step waits for ----
// WeightPublisher::publish (one copy into the snapshot's payload, digest and
// block checksums hashed from cache) against what it did before: a clone of
// each tensor, then model::weight_manifest's digest over the clones.
void publish_costs(int reps, std::FILE* out, bool json) {
  model::Policy policy(qwen2_100m_config());
  model::init_weights(*policy, 0);
  const auto tensors = model::parameter_tensors(*policy);
  WeightPublisher publisher(1);
  std::vector<double> now, before;
  for (int rep = 0; rep < reps + 1; ++rep) {
    auto start = Clock::now();
    if (!publisher.publish(rep + 1, tensors).ok()) std::exit(1);
    if (rep > 0) now.push_back(seconds_since(start));
    start = Clock::now();
    {
      std::unordered_map<std::string, at::Tensor> copies;
      for (const auto& [name, t] : tensors) copies.emplace(name, t.contiguous().clone());
      check(model::weight_manifest(copies, rep + 1), "weight_manifest");
    }
    if (rep > 0) before.push_back(seconds_since(start));
  }
  std::fprintf(out,
               "publish a version: %.3f s (clone + separate digest pass: %.3f s, %.2fx as long)\n",
               median(now), median(before), median(before) / median(now));
  if (json) {
    relay::bench::JsonRow("weight_sync")
        .add("mode", "publish")
        .add("seconds", median(now))
        .add("clone_then_digest_s", median(before))
        .print();
  }
}

// ---- the receiver's CPU work, without a network ----
void cpu_costs(const WeightSnapshot& snap, int64_t bucket, int reps, std::FILE* out, bool json) {
  BucketReader reader(snap, static_cast<uint64_t>(bucket));
  std::vector<double> recv;
  at::Tensor payload;
  for (int rep = 0; rep < reps + 1; ++rep) {
    auto a =
        check(VersionAssembler::create(snap.manifest, static_cast<uint64_t>(bucket),
                                       snap.block_bytes, snap.block_checksums, std::move(payload)),
              "create");
    double t = 0;
    for (uint64_t k = 0; k < reader.bucket_count(); ++k) {
      reader.read(k, static_cast<char*>(a->bucket(k).data_ptr()));  // the "network", not timed
      const auto s = Clock::now();
      if (!a->add_bucket(k).ok()) std::exit(1);
      t += seconds_since(s);
    }
    const auto s = Clock::now();
    check(a->finish(), "finish");
    if (rep > 0) recv.push_back(t + seconds_since(s));
    payload = a->payload();
  }
  const double gb = static_cast<double>(snap.total_bytes) / 1e9;
  std::fprintf(
      out,
      "receiver's cpu work per version, no network (%lld MB buckets): block checksums %.3f s "
      "(%.1f GB/s); the sender sends slices of the snapshot and hashes nothing\n",
      (long long)(bucket >> 20), median(recv), gb / median(recv));
  if (json) {
    relay::bench::JsonRow("weight_sync")
        .add("mode", "cpu_costs")
        .add("bucket_mb", bucket >> 20)
        .add("receiver_s", median(recv))
        .print();
  }
}

// ---- tcp: plain loopback sockets ----
class TcpCopy {
 public:
  TcpCopy(const at::Tensor& flat, int clients) : flat_(flat) {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener, clients) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      std::perror("tcp: listen");
      std::exit(1);
    }
    for (int c = 0; c < clients; ++c) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        std::perror("tcp: connect");
        std::exit(1);
      }
      recv_fds_.push_back(fd);
      const int s = ::accept(listener, nullptr, nullptr);
      if (s < 0) {
        std::perror("tcp: accept");
        std::exit(1);
      }
      send_fds_.push_back(s);
      at::Tensor buf = torch::empty({flat.numel()}, torch::kUInt8);
      buf.zero_();  // touch every page before the clock starts
      bufs_.push_back(buf);
    }
    ::close(listener);
  }
  ~TcpCopy() {
    for (int fd : send_fds_) ::close(fd);
    for (int fd : recv_fds_) ::close(fd);
  }

  double run() {
    const int64_t total = flat_.numel();
    const auto start = Clock::now();
    std::vector<std::thread> readers;
    for (size_t c = 0; c < recv_fds_.size(); ++c) {
      readers.emplace_back([this, c, total] {
        char* dst = static_cast<char*>(bufs_[c].data_ptr());
        for (int64_t got = 0; got < total;) {
          const ssize_t n = ::read(recv_fds_[c], dst + got, std::min(kChunk, total - got));
          if (n <= 0) {
            std::perror("tcp: read");
            std::exit(1);
          }
          got += n;
        }
      });
    }
    const char* src = static_cast<const char*>(flat_.data_ptr());
    for (int64_t off = 0; off < total; off += kChunk) {
      const int64_t n = std::min(kChunk, total - off);
      for (int fd : send_fds_) {
        for (int64_t sent = 0; sent < n;) {
          const ssize_t w = ::write(fd, src + off + sent, n - sent);
          if (w <= 0) {
            std::perror("tcp: write");
            std::exit(1);
          }
          sent += w;
        }
      }
    }
    for (auto& t : readers) t.join();
    return seconds_since(start);
  }

  void check_bytes() const {
    for (size_t c = 0; c < bufs_.size(); ++c) {
      if (!torch::equal(bufs_[c], flat_))
        std::fprintf(stderr, "tcp: client %zu got other bytes\n", c);
    }
  }

 private:
  static constexpr int64_t kChunk = int64_t{4} << 20;
  at::Tensor flat_;
  std::vector<int> send_fds_, recv_fds_;
  std::vector<at::Tensor> bufs_;
};

// ---- gloo: c10d Gloo broadcast of the flat bytes ----
class GlooBroadcast {
 public:
  GlooBroadcast(const at::Tensor& flat, int clients, int64_t bucket)
      : flat_(flat), bucket_(bucket), size_(clients + 1) {
    c10d::TCPStoreOptions so;
    so.port = 0;
    so.isServer = true;
    so.waitWorkers = false;
    server_ = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    pgs_.resize(size_);
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([&, r] {
        c10d::TCPStoreOptions co;
        co.port = server_->getPort();
        co.waitWorkers = false;
        auto store = c10::make_intrusive<c10d::PrefixStore>(
            "raw", c10::make_intrusive<c10d::TCPStore>("127.0.0.1", co));
        auto o = c10d::ProcessGroupGloo::Options::create();
        o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        pgs_[r] = c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, size_, o);
      });
    }
    for (auto& t : threads) t.join();
    dst_.resize(size_);
    dst_[0] = flat;
    for (int r = 1; r < size_; ++r) {
      dst_[r] = torch::empty({flat.numel()}, torch::kUInt8);
      dst_[r].zero_();
    }
  }

  double run() {
    const int64_t total = flat_.numel();
    auto rank = [&](int r) {
      std::vector<c10::intrusive_ptr<c10d::Work>> in_flight;
      for (int64_t off = 0; off < total; off += bucket_) {
        if (in_flight.size() == 2) {
          in_flight.front()->wait();
          in_flight.erase(in_flight.begin());
        }
        std::vector<at::Tensor> v{dst_[r].narrow(0, off, std::min(bucket_, total - off))};
        in_flight.push_back(pgs_[r]->broadcast(v));
      }
      for (auto& w : in_flight) w->wait();
    };
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) threads.emplace_back(rank, r);
    for (auto& t : threads) t.join();
    return seconds_since(start);
  }

  void check_bytes() const {
    for (int r = 1; r < size_; ++r) {
      if (!torch::equal(dst_[r], flat_))
        std::fprintf(stderr, "gloo: client %d got other bytes\n", r);
    }
  }

 private:
  at::Tensor flat_;
  int64_t bucket_;
  int size_;
  c10::intrusive_ptr<c10d::TCPStore> server_;
  std::vector<c10::intrusive_ptr<c10d::ProcessGroupGloo>> pgs_;
  std::vector<at::Tensor> dst_;
};

// ---- relay: WeightSyncServer -> WeightSyncClient ----
class RelayBroadcast {
 public:
  RelayBroadcast(const WeightSnapshot& snap, int clients, int64_t bucket) : snap_(snap) {
    WeightSyncServerOptions so;
    so.bucket_bytes = bucket;
    so.timeout = std::chrono::seconds(60);
    server_ = check(WeightSyncServer::start(so), "WeightSyncServer::start");
    for (int c = 0; c < clients; ++c) {
      WeightSyncClientOptions o;
      o.endpoint = server_->endpoint();
      o.member_name = "bench-" + std::to_string(c);
      o.timeout = std::chrono::seconds(60);
      clients_.push_back(check(WeightSyncClient::connect(o), "WeightSyncClient::connect"));
    }
  }

  double run() {
    const int n = static_cast<int>(clients_.size());
    std::vector<std::thread> threads;
    std::vector<ReceivedVersion> got(n);
    for (int c = 0; c < n; ++c) {
      threads.emplace_back([&, c] { got[c] = check(clients_[c]->receive(nullptr), "receive"); });
    }
    const auto start = Clock::now();
    BroadcastReport report = check(server_->broadcast(snap_), "broadcast");
    for (auto& t : threads) t.join();
    const double s = seconds_since(start);
    if (report.members != n || got[0].manifest.digest != snap_.manifest.digest) {
      std::fprintf(stderr, "relay: %d members, digest mismatch\n", report.members);
    }
    return s;  // `got` goes here: the clients receive the next version into the same buffer
  }

 private:
  const WeightSnapshot& snap_;
  std::unique_ptr<WeightSyncServer> server_;
  std::vector<std::unique_ptr<WeightSyncClient>> clients_;
};

// ---- grpc: FetchWeights from a real TrainerService ----
class GrpcFetch {
 public:
  GrpcFetch(WeightPublisher& publisher, int clients, uint64_t chunk_bytes)
      : chunk_bytes_(chunk_bytes),
        dir_(std::filesystem::temp_directory_path().string() + "/relay_weight_sync_bench_" +
             std::to_string(::getpid())) {
    std::filesystem::remove_all(dir_);
    store::StoreOptions so;
    so.path = dir_;
    rollouts_ = check(store::RolloutStore::open(so), "RolloutStore::open");
    dispenser_ = check(store::PromptDispenser::open(rollouts_.get(), store::DispenserOptions{}),
                       "PromptDispenser::open");
    service_ = std::make_unique<TrainerService>(
        TrainerServiceOptions{}, rollouts_.get(), dispenser_.get(), &publisher,
        [](const store::Lease&) -> StatusOr<PromptContent> { return PromptContent{}; },
        [] { return 1; });
    rpc_ = check(RpcServer::start(ServerOptions{}, {service_->worker_service()}), "RpcServer");
    for (int c = 0; c < clients; ++c) {
      ClientOptions o;
      o.address = "127.0.0.1:" + std::to_string(rpc_->port());
      o.timeout_ms = 120000;
      clients_.push_back(check(GrpcTrainerClient::connect(o), "TrainerClient::connect"));
    }
  }
  ~GrpcFetch() {
    rpc_->shutdown();
    rpc_.reset();
    service_.reset();
    dispenser_.reset();
    rollouts_.reset();
    std::filesystem::remove_all(dir_);
  }

  TrainerClient& client(size_t c) { return *clients_[c]; }

  double run() {
    std::vector<std::thread> threads;
    const auto start = Clock::now();
    for (size_t c = 0; c < clients_.size(); ++c) {
      threads.emplace_back(
          [&, c] { check(clients_[c]->fetch_weights("bench", 1, chunk_bytes_), "fetch_weights"); });
    }
    for (auto& t : threads) t.join();
    return seconds_since(start);
  }

 private:
  uint64_t chunk_bytes_;  // 0: the trainer's default
  std::string dir_;
  std::unique_ptr<store::RolloutStore> rollouts_;
  std::unique_ptr<store::PromptDispenser> dispenser_;
  std::unique_ptr<TrainerService> service_;
  std::unique_ptr<RpcServer> rpc_;
  std::vector<std::unique_ptr<TrainerClient>> clients_;
};

// ---- decoding through a version fetched over gRPC ----
// What a rollout worker with services.weight_sync fetch produces while a
// version arrives (comm/worker/rollout_worker.cc): an engine decodes B
// sequences of qwen2-100m; version 1 is announced; the engine must decode
// S more steps and have the version applied (rollout.interrupt recompute:
// the sequences in flight re-run under it). Two ways, as
// RolloutWorkerOptions::fetch_in_background says:
//   loop        the loop fetches (FetchWeights, verified), stages, then
//               decodes: nothing is decoded during the download (how the
//               worker fetched until 2026-11-30; the baseline);
//   background  a WeightFetcher downloads on its thread while the loop
//               decodes, and the loop stages the version at the first step
//               after it arrived; steps continue until S are done and the
//               version is applied.
// Each repetition runs both, in alternating order, each on a fresh group.
// Reported: the medians of wall time and of tokens decoded; "vs loop" is
// background tokens/s over loop tokens/s.
struct ThroughFetch {
  double seconds = 0;
  int64_t steps = 0;
  double fetch_s = 0;              // announcement to staging
  int64_t steps_during_fetch = 0;  // decode steps while the download ran
};

ThroughFetch decode_through_a_fetch(rollout::Engine& engine, TrainerClient& client, int64_t version,
                                    bool background, int64_t batch, int64_t steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  rollout::PromptGroup g;
  g.group_id = "g" + std::to_string(seed);
  g.k = static_cast<int>(batch);
  g.seed = seed;
  for (int i = 0; i < 16; ++i) g.prompt.push_back(static_cast<int64_t>(rng() % 32000));
  if (Status st = engine.submit(std::move(g)); !st.ok()) {
    std::fprintf(stderr, "submit: %s\n", std::string(st.message()).c_str());
    std::exit(1);
  }
  for (int i = 0; i < 8; ++i) check(engine.step(), "step");  // prefill, then a few tokens
  ThroughFetch r;
  const auto start = Clock::now();
  auto stage = [&](FetchedWeights w) {
    if (!engine.update_weights(w.manifest.version, w.manifest.digest, std::move(w.tensors)).ok()) {
      std::exit(1);
    }
    r.fetch_s = seconds_since(start);
  };
  if (!background) {
    stage(check(fetch_verified(client, "bench", version, 0), "fetch_weights"));
    for (; r.steps < steps; ++r.steps) check(engine.step(), "step");
  } else {
    WeightFetcher fetcher(&client, "bench", 0);
    fetcher.want(version);
    bool staged = false, applied = false;
    while (r.steps < steps || !applied) {
      if (!staged) {
        if (auto w = fetcher.take()) {
          stage(check(std::move(*w), "fetch_weights"));
          staged = true;
        } else {
          ++r.steps_during_fetch;
        }
      }
      check(engine.step(), "step");
      ++r.steps;
      applied = staged;  // a step after staging applies the version
    }
  }
  r.seconds = seconds_since(start);
  engine.abort();
  check(engine.run(), "abort");
  return r;
}

void fetch_while_decoding(WeightPublisher& publisher, const WeightSnapshot& snap, int reps,
                          int64_t batch, int64_t steps, const c10::Device& device, std::FILE* out,
                          bool json) {
  GrpcFetch service(publisher, 1, 0);
  model::Policy policy(qwen2_100m_config());
  model::init_weights(*policy, 0);
  policy->to(device);  // the fetched versions stay on the host until applied
  rollout::EngineOptions eo;
  eo.num_slots = batch;
  eo.max_new_tokens = 8 + 4 * steps + 64;  // never reached: the group is aborted
  auto engine = check(rollout::Engine::create(policy, eo, 1, snap.manifest.digest), "engine");
  // Versions 2, 3, ...: the same bytes under new numbers, so that each
  // repetition fetches and applies a version the engine does not have.
  std::vector<ThroughFetch> loop, bg;
  for (int rep = 0; rep < reps + 1; ++rep) {
    for (int m = 0; m < 2; ++m) {
      const bool background = (rep + m) % 2 == 1;
      const int64_t v = 2 + 2 * rep + m;
      std::unordered_map<std::string, at::Tensor> tensors;
      for (size_t i = 0; i < snap.tensors.size(); ++i) {
        tensors[snap.manifest.tensors[i].name] = snap.tensors[i];
      }
      if (!publisher.publish(v, tensors).ok()) std::exit(1);
      ThroughFetch r = decode_through_a_fetch(*engine, service.client(0), v, background, batch,
                                              steps, 100 + static_cast<uint64_t>(v));
      if (rep > 0) (background ? bg : loop).push_back(r);
    }
  }
  auto med = [](const std::vector<ThroughFetch>& rs, auto field) {
    std::vector<double> xs;
    for (const ThroughFetch& r : rs) xs.push_back(static_cast<double>(field(r)));
    return median(xs);
  };
  const double loop_s = med(loop, [](const ThroughFetch& r) { return r.seconds; });
  const double bg_s = med(bg, [](const ThroughFetch& r) { return r.seconds; });
  const double bg_steps = med(bg, [](const ThroughFetch& r) { return r.steps; });
  const double loop_tps = static_cast<double>(batch * steps) / loop_s;
  const double bg_tps = static_cast<double>(batch) * bg_steps / bg_s;
  const double loop_fetch = med(loop, [](const ThroughFetch& r) { return r.fetch_s; });
  const double bg_fetch = med(bg, [](const ThroughFetch& r) { return r.fetch_s; });
  const double during = med(bg, [](const ThroughFetch& r) { return r.steps_during_fetch; });
  std::fprintf(out,
               "decoding through a fetched version (qwen2-100m on %s, batch %lld, %lld steps "
               "after the announcement, median of %d):\n"
               "  loop        %.3f s, %.0f tokens/s (fetch %.3f s, no step meanwhile)\n"
               "  background  %.3f s, %.0f steps, %.0f tokens/s (fetch %.3f s, %.0f steps "
               "meanwhile)  vs loop %.2f\n",
               device.str().c_str(), (long long)batch, (long long)steps, reps, loop_s, loop_tps,
               loop_fetch, bg_s, bg_steps, bg_tps, bg_fetch, during, bg_tps / loop_tps);
  if (json) {
    relay::bench::JsonRow("weight_sync")
        .add("mode", "decode_through_fetch")
        .add("device", device.str())
        .add("batch", batch)
        .add("steps", steps)
        .add("loop_s", loop_s)
        .add("loop_tokens_per_s", loop_tps)
        .add("loop_fetch_s", loop_fetch)
        .add("background_s", bg_s)
        .add("background_steps", bg_steps)
        .add("background_tokens_per_s", bg_tps)
        .add("background_fetch_s", bg_fetch)
        .add("background_steps_during_fetch", during)
        .add("vs_loop", bg_tps / loop_tps)
        .add("reps", reps)
        .print();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> clients = {1, 2};
  std::vector<int64_t> buckets_mb = {64, 8};
  int reps = 5;
  uint64_t fetch_chunk = 0;
  bool grpc = true;
  bool json = false;
  int64_t decode_batch = 8, decode_steps = 32;
  std::string decode_device = "cpu";
  const char* cpu_memory = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--clients" && i + 1 < argc) {
      clients = parse_list(argv[++i]);
    } else if (a == "--bucket-mb" && i + 1 < argc) {
      buckets_mb = parse_list(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--fetch-chunk-kb" && i + 1 < argc) {
      fetch_chunk = static_cast<uint64_t>(std::atoll(argv[++i])) << 10;
    } else if (a == "--cpu-memory" && i + 1 < argc) {
      cpu_memory = argv[++i];
    } else if (a == "--decode-batch" && i + 1 < argc) {
      decode_batch = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (a == "--decode-device" && i + 1 < argc) {
      decode_device = argv[++i];
    } else if (a == "--decode-steps" && i + 1 < argc) {
      decode_steps = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (a == "--skip-grpc") {
      grpc = false;
    } else if (a == "--quick") {
      clients = {1};
      buckets_mb = {64};
      reps = 3;
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr,
                   "usage: weight_sync_bench [--clients 1,2] [--bucket-mb 64,8] [--reps 5] "
                   "[--fetch-chunk-kb N] [--decode-batch 8] [--decode-steps 32] "
                   "[--decode-device cpu|cuda[:i]] [--skip-grpc] [--cpu-memory keep|return] "
                   "[--quick] [--json]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  const c10::Device decode_on = check(model::parse_device(decode_device), "--decode-device");
  // As relay's binaries set it; before any thread.
  relay::bench::configure_cpu_memory(cpu_memory);
  std::FILE* out = json ? stderr : stdout;  // the human-readable table
  spdlog::set_level(spdlog::level::warn);
  torch::set_num_threads(1);
  const auto begin = Clock::now();

  WeightPublisher publisher;
  auto snap = qwen2_100m_snapshot(publisher);
  const double gb = static_cast<double>(snap->total_bytes) / 1e9;
  const at::Tensor flat = snap->payload;  // the same bytes, in one buffer
  std::fprintf(out, "qwen2-100m: %zu tensors, %.1f MB fp32; loopback, %u cores, median of %d\n",
               snap->tensors.size(), gb * 1e3, std::thread::hardware_concurrency(), reps);
  publish_costs(reps, out, json);
  for (int64_t mb : buckets_mb) cpu_costs(*snap, mb << 20, reps, out, json);
  const double apply = engine_apply_seconds(*snap, reps);
  std::fprintf(out, "engine: staging and applying a version (nothing in flight) takes %.3f s\n",
               apply);
  if (json) {
    relay::bench::JsonRow("weight_sync").add("mode", "engine_apply").add("seconds", apply).print();
  }
  std::fprintf(out, "%-6s %7s %11s %9s %8s %7s %7s\n", "mode", "clients", "bucket", "seconds",
               "GB/s", "vs tcp", "vs gloo");
  for (int64_t c : clients) {
    const int n = static_cast<int>(c);
    // Every mode's set-up first, then repetitions that run each once in turn.
    TcpCopy tcp(flat, n);
    std::vector<std::unique_ptr<GlooBroadcast>> gloo;
    std::vector<std::unique_ptr<RelayBroadcast>> relay_bc;
    for (int64_t mb : buckets_mb) {
      gloo.push_back(std::make_unique<GlooBroadcast>(flat, n, mb << 20));
      relay_bc.push_back(std::make_unique<RelayBroadcast>(*snap, n, mb << 20));
    }
    std::unique_ptr<GrpcFetch> fetch;
    if (grpc) fetch = std::make_unique<GrpcFetch>(publisher, n, fetch_chunk);
    std::vector<double> t_tcp, t_fetch;
    std::vector<std::vector<double>> t_gloo(buckets_mb.size()), t_relay(buckets_mb.size());
    for (int rep = 0; rep < reps + 1; ++rep) {
      const bool timed = rep > 0;
      const double a = tcp.run();
      if (timed) t_tcp.push_back(a);
      for (size_t b = 0; b < buckets_mb.size(); ++b) {
        const double g = gloo[b]->run();
        const double r = relay_bc[b]->run();
        if (timed) t_gloo[b].push_back(g), t_relay[b].push_back(r);
      }
      if (fetch) {
        const double f = fetch->run();
        if (timed) t_fetch.push_back(f);
      }
    }
    tcp.check_bytes();
    for (auto& g : gloo) g->check_bytes();
    const double base = median(t_tcp);
    auto row = [&](const char* mode, const std::string& bucket, double s, double gloo_s) {
      std::fprintf(out, "%-6s %7d %11s %9.3f %8.2f %7.2f %7s\n", mode, n, bucket.c_str(), s, gb / s,
                   base / s, gloo_s > 0 ? absl::StrFormat("%.2f", gloo_s / s).c_str() : "-");
      if (json) {
        relay::bench::JsonRow j("weight_sync");
        j.add("mode", mode).add("clients", n).add("bucket", bucket).add("seconds", s);
        j.add("gb_per_s", gb / s).add("vs_tcp", base / s);
        if (gloo_s > 0) j.add("vs_gloo", gloo_s / s);
        j.add("reps", reps).print();
      }
    };
    row("tcp", "4 MB writes", base, 0);
    for (size_t b = 0; b < buckets_mb.size(); ++b) {
      const std::string bucket = std::to_string(buckets_mb[b]) + " MB";
      const double g = median(t_gloo[b]);
      row("gloo", bucket, g, g);
      row("relay", bucket, median(t_relay[b]), g);
    }
    if (fetch) {
      const double f = median(t_fetch);
      row("grpc", fetch_chunk ? std::to_string(fetch_chunk >> 10) + " KB chunks" : "256 KB chunks",
          f, median(t_gloo[0]));
      std::fprintf(out,
                   "  a worker's generation loop per version: broadcast %.3f s (apply only), "
                   "fetch %.3f s (fetch + apply)\n",
                   apply, f + apply);
    }
    std::fflush(out);
  }
  if (grpc) {
    // Decoding as relay-rollout does: every core, as its binaries set them.
    model::configure_threads(0);
    fetch_while_decoding(publisher, *snap, reps, decode_batch, decode_steps, decode_on, out, json);
  }
  std::fprintf(out, "weight_sync_bench: %.0f s\n", seconds_since(begin));
  return 0;
}
