// Weight delivery to rollout workers on loopback (relay/comm/weight_sync.h):
// one version of a ~100M-parameter model (qwen2-100m of rollout_bench, fp32,
// ~400 MB) from a trainer to C clients, each client a thread of this process.
//
//   raw    (baseline) c10d ProcessGroupGloo broadcast of the same bytes in
//          buckets of the same size, two in flight, from one flat buffer into
//          one flat buffer per client: no copies, no checksums, no manifest;
//   relay  WeightSyncServer::broadcast -> WeightSyncClient::receive: header,
//          manifest, buckets copied out of the snapshot and hashed, trailer,
//          reassembled into per-tensor tensors and verified (bucket checksums
//          and the manifest digest);
//   grpc   the fallback: TrainerService + RpcServer on 127.0.0.1 and C
//          TrainerClient::fetch_weights calls at once (4 MiB chunks, each
//          checksummed, digest checked).
// A row's time runs from the send until every client holds the version;
// GB/s = version bytes / time (what each client gets); ratio = raw time / this
// row's time (1 = as fast as a bare broadcast). The median of --reps runs;
// relay's first broadcast (group formation) is not timed.
//
//   weight_sync_bench [--clients 1,2] [--bucket-mb 64] [--reps 3] [--skip-grpc]

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "relay/comm/rpc.h"
#include "relay/comm/trainer_service.h"
#include "relay/comm/weight_buckets.h"
#include "relay/comm/weight_publisher.h"
#include "relay/comm/weight_sync.h"
#include "relay/model/policy.h"
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

// ---- the CPU work of each side, without a network ----
void cpu_costs(const WeightSnapshot& snap, int64_t bucket, int reps) {
  BucketReader reader(snap, static_cast<uint64_t>(bucket));
  at::Tensor slot = torch::empty({bucket}, torch::kUInt8);
  std::vector<uint64_t> sums(reader.bucket_count());
  std::vector<double> send, recv;
  at::Tensor payload;
  for (int rep = 0; rep < reps + 1; ++rep) {
    auto start = Clock::now();
    for (uint64_t k = 0; k < reader.bucket_count(); ++k) {
      if (!reader.view(k, &sums[k]).defined()) {
        sums[k] = reader.read(k, static_cast<char*>(slot.data_ptr()));
      }
    }
    if (rep > 0) send.push_back(seconds_since(start));
    auto a = check(
        VersionAssembler::create(snap.manifest, static_cast<uint64_t>(bucket), std::move(payload)),
        "create");
    double t = 0;
    for (uint64_t k = 0; k < reader.bucket_count(); ++k) {
      reader.read(k, static_cast<char*>(a->bucket(k).data_ptr()));  // the "network", not timed
      const auto s = Clock::now();
      if (!a->add_bucket(k).ok()) std::exit(1);
      t += seconds_since(s);
    }
    const auto s = Clock::now();
    check(a->finish(sums), "finish");
    if (rep > 0) recv.push_back(t + seconds_since(s));
    payload = a->payload();
  }
  const double gb = static_cast<double>(snap.total_bytes) / 1e9;
  std::printf(
      "cpu work per version, no network (%lld MB buckets): sender copy (or view)+hash %.3f s "
      "(%.1f GB/s), receiver hash+verify %.3f s (%.1f GB/s)\n",
      (long long)(bucket >> 20), median(send), gb / median(send), median(recv), gb / median(recv));
}

// ---- raw: c10d Gloo broadcast of the flat bytes ----
double raw_broadcast(const at::Tensor& flat, int clients, int64_t bucket, int reps) {
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  const int size = clients + 1;
  std::vector<c10::intrusive_ptr<c10d::ProcessGroupGloo>> pgs(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      c10d::TCPStoreOptions co;
      co.port = server->getPort();
      co.waitWorkers = false;
      auto store = c10::make_intrusive<c10d::PrefixStore>(
          "raw", c10::make_intrusive<c10d::TCPStore>("127.0.0.1", co));
      auto o = c10d::ProcessGroupGloo::Options::create();
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      pgs[r] = c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, size, o);
    });
  }
  for (auto& t : threads) t.join();
  const int64_t total = flat.numel();
  std::vector<at::Tensor> dst(size);
  dst[0] = flat;
  for (int r = 1; r < size; ++r) dst[r] = torch::empty({total}, torch::kUInt8);
  auto run = [&](int r) {
    std::vector<c10::intrusive_ptr<c10d::Work>> in_flight;
    for (int64_t off = 0; off < total; off += bucket) {
      if (in_flight.size() == 2) {
        in_flight.front()->wait();
        in_flight.erase(in_flight.begin());
      }
      std::vector<at::Tensor> v{dst[r].narrow(0, off, std::min(bucket, total - off))};
      in_flight.push_back(pgs[r]->broadcast(v));
    }
    for (auto& w : in_flight) w->wait();
  };
  std::vector<double> times;
  for (int rep = 0; rep < reps + 1; ++rep) {
    const auto start = Clock::now();
    threads.clear();
    for (int r = 0; r < size; ++r) threads.emplace_back(run, r);
    for (auto& t : threads) t.join();
    if (rep > 0) times.push_back(seconds_since(start));  // the first one warms the pairs
  }
  for (int r = 1; r < size; ++r) {
    if (!torch::equal(dst[r], flat)) std::fprintf(stderr, "raw: client %d got other bytes\n", r);
  }
  return median(times);
}

// ---- relay: WeightSyncServer -> WeightSyncClient ----
double relay_broadcast(const WeightSnapshot& snap, int clients, int64_t bucket, int reps) {
  WeightSyncServerOptions so;
  so.bucket_bytes = bucket;
  so.timeout = std::chrono::seconds(60);
  auto server = check(WeightSyncServer::start(so), "WeightSyncServer::start");
  std::vector<std::unique_ptr<WeightSyncClient>> cs;
  for (int c = 0; c < clients; ++c) {
    WeightSyncClientOptions o;
    o.endpoint = server->endpoint();
    o.member_name = "bench-" + std::to_string(c);
    o.timeout = std::chrono::seconds(60);
    cs.push_back(check(WeightSyncClient::connect(o), "WeightSyncClient::connect"));
  }
  std::vector<double> times;
  for (int rep = 0; rep < reps + 1; ++rep) {
    std::vector<std::thread> threads;
    std::vector<ReceivedVersion> got(clients);
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] { got[c] = check(cs[c]->receive(nullptr), "receive"); });
    }
    const auto start = Clock::now();
    BroadcastReport report = check(server->broadcast(snap), "broadcast");
    for (auto& t : threads) t.join();
    const double s = seconds_since(start);
    if (rep > 0) times.push_back(s);  // the first one forms the group
    if (report.members != clients || got[0].manifest.digest != snap.manifest.digest) {
      std::fprintf(stderr, "relay: %d members, digest mismatch\n", report.members);
    }
  }
  return median(times);
}

// ---- grpc: FetchWeights from a real TrainerService ----
double grpc_fetch(WeightPublisher& publisher, int clients, int reps) {
  const std::string dir = std::filesystem::temp_directory_path().string() +
                          "/relay_weight_sync_bench_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  store::StoreOptions so;
  so.path = dir;
  auto rollouts = check(store::RolloutStore::open(so), "RolloutStore::open");
  auto dispenser = check(store::PromptDispenser::open(rollouts.get(), store::DispenserOptions{}),
                         "PromptDispenser::open");
  TrainerService service(
      TrainerServiceOptions{}, rollouts.get(), dispenser.get(), &publisher,
      [](int64_t, int) -> StatusOr<PromptContent> { return PromptContent{}; }, [] { return 1; });
  auto rpc = check(RpcServer::start(ServerOptions{}, {service.worker_service()}), "RpcServer");
  std::vector<std::unique_ptr<TrainerClient>> cs;
  for (int c = 0; c < clients; ++c) {
    ClientOptions o;
    o.address = "127.0.0.1:" + std::to_string(rpc->port());
    o.timeout_ms = 120000;
    cs.push_back(check(TrainerClient::connect(o), "TrainerClient::connect"));
  }
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<std::thread> threads;
    const auto start = Clock::now();
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] { check(cs[c]->fetch_weights("bench", 1), "fetch_weights"); });
    }
    for (auto& t : threads) t.join();
    times.push_back(seconds_since(start));
  }
  rpc->shutdown();
  std::filesystem::remove_all(dir);
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> clients = {1, 2};
  std::vector<int64_t> buckets_mb = {64};
  int reps = 3;
  bool grpc = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--clients" && i + 1 < argc) {
      clients = parse_list(argv[++i]);
    } else if (a == "--bucket-mb" && i + 1 < argc) {
      buckets_mb = parse_list(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--skip-grpc") {
      grpc = false;
    } else {
      std::fprintf(stderr,
                   "usage: weight_sync_bench [--clients 1,2] [--bucket-mb 64] [--reps 3] "
                   "[--skip-grpc]\n");
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  torch::set_num_threads(1);

  WeightPublisher publisher;
  auto snap = qwen2_100m_snapshot(publisher);
  const double gb = static_cast<double>(snap->total_bytes) / 1e9;
  at::Tensor flat = torch::empty({static_cast<int64_t>(snap->total_bytes)}, torch::kUInt8);
  for_each_chunk(*snap, uint64_t{64} << 20, [&](uint64_t off, const char* data, uint64_t n) {
    std::memcpy(static_cast<char*>(flat.data_ptr()) + off, data, n);
    return true;
  });
  std::printf("qwen2-100m: %zu tensors, %.1f MB fp32; loopback, %u cores, median of %d\n",
              snap->tensors.size(), gb * 1e3, std::thread::hardware_concurrency(), reps);
  for (int64_t mb : buckets_mb) cpu_costs(*snap, mb << 20, reps);
  const double apply = engine_apply_seconds(*snap, reps);
  std::printf("engine: staging and applying a version takes %.3f s\n", apply);
  std::printf("%-6s %7s %9s %9s %8s %7s\n", "mode", "clients", "bucket", "seconds", "GB/s",
              "ratio");
  for (int64_t c : clients) {
    for (int64_t mb : buckets_mb) {
      const int64_t bucket = mb << 20;
      const double raw = raw_broadcast(flat, static_cast<int>(c), bucket, reps);
      const double rel = relay_broadcast(*snap, static_cast<int>(c), bucket, reps);
      std::printf("%-6s %7lld %6lld MB %9.3f %8.2f %7.2f\n", "raw", (long long)c, (long long)mb,
                  raw, gb / raw, 1.0);
      std::printf("%-6s %7lld %6lld MB %9.3f %8.2f %7.2f\n", "relay", (long long)c, (long long)mb,
                  rel, gb / rel, raw / rel);
      if (grpc && mb == buckets_mb.front()) {
        const double g = grpc_fetch(publisher, static_cast<int>(c), reps);
        std::printf("%-6s %7lld %9s %9.3f %8.2f %7.2f\n", "grpc", (long long)c, "4 MB chunks", g,
                    gb / g, raw / g);
        std::printf(
            "  pause of a worker's generation loop per version: broadcast %.3f s "
            "(apply only), fetch %.3f s (fetch + apply)\n",
            apply, g + apply);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
