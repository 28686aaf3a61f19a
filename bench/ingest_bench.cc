// Trajectory ingest through gRPC (relay/comm/service/trainer_service.h) against the
// durable rollout store alone, measured in the same run.
// Results: docs/BENCHMARKS.md ("Trajectory ingest through gRPC").
//
// Groups are those of store_bench: K trajectories of P prompt + R response
// tokens with every per-token field filled, token version 3. Each row makes G
// groups durable (WAL fsync before the ack unless "no fsync"):
//   store        (baseline) RolloutStore::append, one group at a time;
//   store-nosync the same with sync_writes off (what the fsync costs);
//   dispenser    PromptDispenser::lease of B prompts, then submit of each
//                group on its lease, in this process: the store plus lease
//                bookkeeping (a lease is a synced write too), no gRPC;
//   grpc         a real TrainerService + RpcServer on 127.0.0.1 over such a
//                store and dispenser; C client threads, each its own
//                TrainerClient, registered, then looping LeasePrompts(B) and
//                one SubmitGroups stream of B groups (one ack per group,
//                sent once the group is durable), G / C groups each;
//   grpc-nosync  the same over a store without the fsync (what gRPC,
//                decoding and validation cost on their own).
// groups/s = G / wall time; MB/s counts the groups' serialized
// v1::TrajectoryGroup bytes; ratio = this row's groups/s / the store's.
// "cpu us/group" is the process's user + system CPU time over the row (all
// threads) per group: with 2 cores, 2 x wall time per group is the ceiling.
// "lease" is the share of the clients' time spent in LeasePrompts. Per-group
// CPU costs of the steps around the store (encode, decode, validate) are
// measured without I/O and printed below the table.
//
//   ingest_bench [--groups G] [--reps N] [--clients 1,2,4] [--batches 1,16] [--dir D]
//                [--cpu-memory keep|return] [--quick] [--json]
// --cpu-memory: the process's malloc policy (bench_util.h), keep as
// relay-trainer's.
// --quick = --groups 256 --reps 3 --clients 1,4 --batches 16 (given first, later
// flags override it). --json prints one JSON object per row on stdout and the
// table on stderr.
//
// Each figure is the median of --reps runs, each on a fresh store; the rows
// alternate inside each repetition, so drift affects them all alike.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "relay/comm/rpc/grpc_trainer_client.h"
#include "relay/comm/service/submission.h"
#include "relay/comm/service/trainer_service.h"
#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/store/convert.h"
#include "relay/store/dispenser.h"
#include "relay/store/rollout_store.h"
#include "relay/v1/trajectory.pb.h"
#include "relay/v1/worker.pb.h"

namespace {

using relay::bench::Clock;
using relay::bench::median;
using relay::bench::seconds_since;
using namespace relay;
using rollout::Trajectory;
using rollout::TrajectoryGroup;

constexpr int64_t kVersion = 3;          // the trainer's version and every token's
constexpr int64_t kVocab = 151936;       // Qwen2's; token ids are drawn below it
constexpr int64_t kUnbounded = 1000000;  // staleness bound and groups per step

struct Args {
  int groups = 1024;
  int k = 8;
  int prompt = 128;
  int response = 256;
  int reps = 5;
  std::vector<int> clients = {1, 2, 4};
  std::vector<int> batches = {1, 16};
  std::string dir = "/tmp/relay_ingest_bench";
  std::string cpu_memory = "keep";
  bool json = false;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ingest_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T value_or_die(StatusOr<T> v, const char* what) {
  if (!v.ok()) die(std::string(what) + ": " + std::string(v.status().message()));
  return std::move(*v);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::atoi(item.c_str()));
  return out;
}

// User + system CPU seconds of this process (all threads: clients, server,
// RocksDB).
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// One timed row: wall and CPU seconds from the first request to the last ack.
struct Timing {
  double seconds = 0;
  double cpu_seconds = 0;
  double lease_share = -1;  // of the clients' summed time in LeasePrompts; < 0 = none
};

class Timer {
 public:
  Timer() : wall_(Clock::now()), cpu_(cpu_seconds()) {}
  Timing done() const { return Timing{seconds_since(wall_), cpu_seconds() - cpu_, -1}; }

 private:
  Clock::time_point wall_;
  double cpu_;
};

std::unique_ptr<store::RolloutStore> open_store(const std::string& path, bool sync) {
  std::filesystem::remove_all(path);
  store::StoreOptions o;
  o.path = path;
  o.sync_writes = sync;
  return value_or_die(store::RolloutStore::open(o), "open store");
}

std::unique_ptr<store::PromptDispenser> open_dispenser(store::RolloutStore* s, const Args& a) {
  store::DispenserOptions d;
  d.groups_per_step = kUnbounded;  // capacity never makes a lease wait
  d.max_staleness = kUnbounded;
  d.k = a.k;
  return value_or_die(store::PromptDispenser::open(s, d), "open dispenser");
}

Timing run_store(const std::vector<TrajectoryGroup>& groups, const std::string& path, bool sync) {
  auto s = open_store(path, sync);
  const Timer timer;
  for (const TrajectoryGroup& g : groups) value_or_die(s->append(g, kVersion), "append");
  return timer.done();
}

Timing run_dispenser(const std::vector<TrajectoryGroup>& groups, const std::string& path, int batch,
                     const Args& a) {
  auto s = open_store(path, true);
  auto d = open_dispenser(s.get(), a);
  const Timer timer;
  for (size_t done = 0; done < groups.size();) {
    auto leases = value_or_die(d->lease("w", batch, kVersion), "lease");
    for (const store::Lease& l : leases) {
      value_or_die(d->submit(l.id, groups[l.prompt_index % groups.size()], kVersion), "submit");
    }
    done += leases.size();
  }
  return timer.done();
}

// One client's loop: lease `batch`, submit them on one stream, until `n` done.
void client_loop(comm::TrainerClient* client, const std::string& worker_id, int n, int batch,
                 const std::vector<TrajectoryGroup>& groups, double* lease_s, double* total_s) {
  std::vector<std::pair<uint64_t, TrajectoryGroup>> pending;
  const auto t0 = Clock::now();
  for (int done = 0; done < n;) {
    const auto tl = Clock::now();
    auto leases =
        value_or_die(client->lease_prompts(worker_id, std::min(batch, n - done)), "LeasePrompts");
    *lease_s += seconds_since(tl);
    if (leases.leases_size() == 0) die("LeasePrompts: no leases (staleness capacity?)");
    pending.resize(leases.leases_size());
    for (int i = 0; i < leases.leases_size(); ++i) {
      pending[i].first = leases.leases(i).lease_id();
      pending[i].second = groups[leases.leases(i).prompt_index() % groups.size()];
    }
    auto acks = value_or_die(client->submit_groups(worker_id, pending), "SubmitGroups");
    for (const v1::SubmitGroupAck& ack : acks) {
      if (!ack.accepted()) die("SubmitGroups: refused: " + ack.error_message());
    }
    done += leases.leases_size();
  }
  *total_s = seconds_since(t0);
}

Timing run_grpc(const std::vector<TrajectoryGroup>& groups, const std::string& path, bool sync,
                int clients, int batch, const Args& a) {
  auto s = open_store(path, sync);
  auto d = open_dispenser(s.get(), a);
  comm::WeightPublisher publisher;  // nothing published: RegisterWorker sends no manifest
  comm::TrainerServiceOptions o;
  o.max_staleness = kUnbounded;
  o.limits.vocab_size = kVocab;
  comm::TrainerService service(
      o, s.get(), d.get(), &publisher,
      [&groups](const store::Lease& l) -> StatusOr<comm::PromptContent> {
        const TrajectoryGroup& g = groups[l.prompt_index % groups.size()];
        comm::PromptContent p;
        p.group_id = g.group_id;
        p.prompt_tokens = g.trajectories.front().prompt_tokens;
        p.seed = 1000 * l.occurrence + l.attempt;
        return p;
      },
      [] { return kVersion; });
  auto server =
      value_or_die(comm::RpcServer::start(comm::ServerOptions{},
                                          {service.worker_service(), service.admin_service()}),
                   "start server");
  std::vector<std::unique_ptr<comm::TrainerClient>> conns;
  std::vector<std::string> ids;
  for (int c = 0; c < clients; ++c) {
    comm::ClientOptions co;
    co.address = "127.0.0.1:" + std::to_string(server->port());
    co.timeout_ms = 120000;
    conns.push_back(value_or_die(comm::GrpcTrainerClient::connect(co), "connect"));
    v1::WorkerCapabilities caps;
    caps.set_device("cpu");
    ids.push_back(value_or_die(conns.back()->register_worker("bench" + std::to_string(c), caps),
                               "RegisterWorker")
                      .worker_id());
  }
  std::vector<double> lease_s(clients, 0), total_s(clients, 0);
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  std::vector<std::thread> threads;
  const int total = static_cast<int>(groups.size());
  for (int c = 0; c < clients; ++c) {
    const int n = total / clients + (c < total % clients ? 1 : 0);
    threads.emplace_back([&, c, n] {
      started.wait();
      client_loop(conns[c].get(), ids[c], n, batch, groups, &lease_s[c], &total_s[c]);
    });
  }
  const Timer timer;
  go.set_value();
  for (std::thread& t : threads) t.join();
  Timing r = timer.done();
  double lease = 0, all = 0;
  for (int c = 0; c < clients; ++c) lease += lease_s[c], all += total_s[c];
  r.lease_share = all > 0 ? lease / all : 0;
  if (s->appended() != groups.size()) die("the store holds fewer groups than were acked");
  server->shutdown();
  return r;
}

// Per-group CPU cost (microseconds) of the steps around the store, no I/O:
// the client's encode, the server's decode and validation.
struct CpuCosts {
  double encode_us = 0, decode_us = 0, validate_us = 0;
};

CpuCosts measure_cpu(const std::vector<TrajectoryGroup>& groups, const Args& a) {
  CpuCosts c;
  std::vector<std::string> wire(groups.size());
  auto t0 = Clock::now();
  for (size_t i = 0; i < groups.size(); ++i) {
    v1::SubmitGroupRequest req;
    req.set_worker_id("w1-bench0");
    req.set_lease_id(i + 1);
    store::to_proto(groups[i], req.mutable_group());
    wire[i] = req.SerializeAsString();
  }
  c.encode_us = 1e6 * seconds_since(t0) / groups.size();
  std::vector<TrajectoryGroup> decoded;
  decoded.reserve(groups.size());
  t0 = Clock::now();
  for (const std::string& w : wire) {
    v1::SubmitGroupRequest req;
    if (!req.ParseFromString(w)) die("parse");
    decoded.push_back(value_or_die(store::from_proto(req.group(), /*check=*/false), "from_proto"));
  }
  c.decode_us = 1e6 * seconds_since(t0) / groups.size();
  comm::SubmissionContext ctx;
  ctx.k = a.k;
  ctx.trainer_version = kVersion;
  comm::SubmissionLimits limits;
  limits.vocab_size = kVocab;
  t0 = Clock::now();
  for (TrajectoryGroup& g : decoded) {
    if (Status s = comm::validate_submission(g, ctx, limits); !s.ok()) {
      die("validate: " + std::string(s.message()));
    }
    comm::normalize_submission(g, limits);
  }
  c.validate_us = 1e6 * seconds_since(t0) / groups.size();
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (k == "--quick") {
      a.groups = 256;
      a.reps = 3;
      a.clients = {1, 4};
      a.batches = {16};
      continue;
    }
    if (k == "--json") {
      a.json = true;
      continue;
    }
    if (v == nullptr) die("unknown option or missing value: " + k);
    ++i;
    if (k == "--groups")
      a.groups = std::atoi(v);
    else if (k == "--reps")
      a.reps = std::atoi(v);
    else if (k == "--clients")
      a.clients = parse_list(v);
    else if (k == "--batches")
      a.batches = parse_list(v);
    else if (k == "--dir")
      a.dir = v;
    else if (k == "--cpu-memory")
      a.cpu_memory = v;
    else
      die("unknown option " + k);
  }
  // As relay-trainer, which hosts this service, sets it; before any thread.
  relay::bench::configure_cpu_memory(a.cpu_memory.c_str());
  if (a.groups < 1 || a.reps < 1) die("--groups and --reps must be >= 1");
  std::filesystem::create_directories(a.dir);
  std::mt19937 rng(7);
  std::vector<TrajectoryGroup> groups;
  double mb = 0;
  for (int i = 0; i < a.groups; ++i) {
    groups.push_back(
        relay::bench::synthetic_group(i, a.k, a.prompt, a.response, kVersion, kVocab, rng));
    v1::TrajectoryGroup wire;
    store::to_proto(groups.back(), &wire);
    mb += wire.ByteSizeLong() / 1e6;
  }

  struct Row {
    std::string path;
    int clients = 0, batch = 0;  // 0 = not applicable
    std::vector<double> seconds = {}, cpu_us = {}, lease_share = {};
  };
  std::vector<Row> rows;
  rows.push_back({"store (fsync)", 0, 0});
  rows.push_back({"store-nosync", 0, 0});
  for (int b : a.batches) rows.push_back({"dispenser (fsync)", 1, b});
  for (int b : a.batches) {
    for (int c : a.clients) rows.push_back({"grpc (fsync)", c, b});
  }
  for (int b : a.batches) {
    for (int c : a.clients) rows.push_back({"grpc-nosync", c, b});
  }
  std::vector<double> encode, decode, validate;

  const auto start = Clock::now();
  for (int r = 0; r < a.reps; ++r) {
    for (Row& row : rows) {
      const std::string path = a.dir + "/store";
      Timing t;
      if (row.path == "store (fsync)" || row.path == "store-nosync") {
        t = run_store(groups, path, row.path == "store (fsync)");
      } else if (row.path == "dispenser (fsync)") {
        t = run_dispenser(groups, path, row.batch, a);
      } else {
        t = run_grpc(groups, path, row.path == "grpc (fsync)", row.clients, row.batch, a);
      }
      row.seconds.push_back(t.seconds);
      row.cpu_us.push_back(1e6 * t.cpu_seconds / groups.size());
      if (t.lease_share >= 0) row.lease_share.push_back(t.lease_share);
    }
    const CpuCosts c = measure_cpu(groups, a);
    encode.push_back(c.encode_us);
    decode.push_back(c.decode_us);
    validate.push_back(c.validate_us);
  }
  std::filesystem::remove_all(a.dir);

  const double n = a.groups;
  std::FILE* out = a.json ? stderr : stdout;  // the human-readable table
  std::fprintf(
      out,
      "ingest_bench: %d groups x K=%d, P=%d, R=%d tokens (%.2f MB serialized, %.1f KB/group); "
      "median of %d; %.0f s\n",
      a.groups, a.k, a.prompt, a.response, mb, 1e3 * mb / n, a.reps, seconds_since(start));
  std::fprintf(out, "%-18s %7s %5s %10s %8s %8s %12s %6s\n", "path", "clients", "batch", "groups/s",
               "MB/s", "vs store", "cpu us/group", "lease");
  const double base = n / median(rows.front().seconds);
  for (const Row& row : rows) {
    const double s = median(row.seconds);
    const std::string c = row.clients > 0 ? std::to_string(row.clients) : "-";
    const std::string b = row.batch > 0 ? std::to_string(row.batch) : "-";
    char lease[16] = "-";
    if (!row.lease_share.empty()) {
      std::snprintf(lease, sizeof lease, "%.0f%%", 100 * median(row.lease_share));
    }
    std::fprintf(out, "%-18s %7s %5s %10.1f %8.1f %8.2f %12.0f %6s\n", row.path.c_str(), c.c_str(),
                 b.c_str(), n / s, mb / s, (n / s) / base, median(row.cpu_us), lease);
    if (a.json) {
      relay::bench::JsonRow j("ingest");
      j.add("path", row.path).add("clients", row.clients).add("batch", row.batch);
      j.add("groups_per_s", n / s).add("mb_per_s", mb / s).add("vs_store", (n / s) / base);
      j.add("cpu_us_per_group", median(row.cpu_us));
      if (!row.lease_share.empty()) j.add("lease_share", median(row.lease_share));
      j.add("groups", a.groups).add("reps", a.reps).print();
    }
  }
  std::fprintf(
      out,
      "per group, no I/O: client encode (to_proto + serialize) %.1f us, server decode (parse + "
      "from_proto) %.1f us, validate + normalize %.1f us\n",
      median(encode), median(decode), median(validate));
  return 0;
}
