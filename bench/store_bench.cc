// Trajectory ingest into the rollout store (relay/store/rollout_store.h)
// against the durable-write floor of the same disk, measured in the same run.
// Results: docs/BENCHMARKS.md ("Rollout store ingest").
//
// Each group is K trajectories of P prompt + R response tokens with every
// per-token field filled (what a worker submits). Three ways to make G groups
// durable, one at a time, as a submitter's acknowledgement requires:
//   raw file   (baseline) append the group's serialized bytes to a plain file
//              and fdatasync after each group: the disk's durable-write floor;
//   store      RolloutStore::append with sync_writes (WAL fsync before ack);
//   store-nosync the same without the fsync (what durability costs).
// Then take: RolloutStore::take_ready of all G groups in batches of 64
// (reads, decodes and marks them consumed in one synced write per batch).
//
//   store_bench [--groups G] [--k K] [--prompt P] [--response R] [--reps N] [--dir D]
//               [--quick] [--json]
// --quick = --groups 256 --reps 3. --json prints one JSON object per row on
// stdout and the table on stderr.
//
// Each figure is the median of --reps runs, each on a fresh store.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "relay/store/convert.h"
#include "relay/store/rollout_store.h"
#include "relay/v1/trajectory.pb.h"

namespace {

using relay::bench::Clock;
using relay::bench::median;
using relay::bench::seconds_since;
using relay::rollout::Trajectory;
using relay::rollout::TrajectoryGroup;

struct Args {
  int groups = 512;
  int k = 8;
  int prompt = 128;
  int response = 256;
  int reps = 5;
  std::string dir = "/tmp/relay_store_bench";
  bool json = false;
};

double run_raw(const std::vector<std::string>& bytes, const std::string& path) {
  std::filesystem::remove(path);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  const auto t0 = Clock::now();
  for (const std::string& b : bytes) {
    if (::write(fd, b.data(), b.size()) != static_cast<ssize_t>(b.size()) || ::fdatasync(fd) != 0) {
      std::perror("write");
      std::exit(1);
    }
  }
  const double s = seconds_since(t0);
  ::close(fd);
  return s;
}

double run_store(const std::vector<TrajectoryGroup>& groups, const std::string& path, bool sync,
                 double* take_seconds) {
  std::filesystem::remove_all(path);
  relay::store::StoreOptions o;
  o.path = path;
  o.sync_writes = sync;
  auto store = relay::store::RolloutStore::open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", std::string(store.status().message()).c_str());
    std::exit(1);
  }
  const auto t0 = Clock::now();
  for (const TrajectoryGroup& g : groups) {
    if (!(*store)->append(g, 3).ok()) std::exit(1);
  }
  const double s = seconds_since(t0);
  if (take_seconds != nullptr) {
    const auto t1 = Clock::now();
    size_t taken = 0;
    while (taken < groups.size()) {
      auto batch = (*store)->take_ready(64, -1, 4);
      if (!batch.ok() || batch->empty()) std::exit(1);
      taken += batch->size();
    }
    *take_seconds = seconds_since(t1);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--quick") {
      a.groups = 256;
      a.reps = 3;
      continue;
    }
    if (k == "--json") {
      a.json = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "unknown option or missing value: %s\n", k.c_str());
      return 2;
    }
    const char* v = argv[++i];
    if (k == "--groups")
      a.groups = std::atoi(v);
    else if (k == "--k")
      a.k = std::atoi(v);
    else if (k == "--prompt")
      a.prompt = std::atoi(v);
    else if (k == "--response")
      a.response = std::atoi(v);
    else if (k == "--reps")
      a.reps = std::atoi(v);
    else if (k == "--dir")
      a.dir = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (a.groups < 1 || a.reps < 1) {
    std::fprintf(stderr, "--groups and --reps must be >= 1\n");
    return 2;
  }
  std::filesystem::create_directories(a.dir);
  std::mt19937 rng(7);
  std::vector<TrajectoryGroup> groups;
  std::vector<std::string> bytes;
  double mb = 0;
  for (int i = 0; i < a.groups; ++i) {
    groups.push_back(relay::bench::synthetic_group(i, a.k, a.prompt, a.response, 3, 151936, rng));
    relay::v1::TrajectoryGroup wire;
    relay::store::to_proto(groups.back(), &wire);
    bytes.push_back(wire.SerializeAsString());
    mb += bytes.back().size() / 1e6;
  }
  std::vector<double> raw, synced, nosync, take;
  for (int r = 0; r < a.reps; ++r) {
    raw.push_back(run_raw(bytes, a.dir + "/raw.bin"));
    double t = 0;
    synced.push_back(run_store(groups, a.dir + "/synced", true, &t));
    take.push_back(t);
    nosync.push_back(run_store(groups, a.dir + "/nosync", false, nullptr));
  }
  std::filesystem::remove_all(a.dir);
  const double n = a.groups;
  std::FILE* out = a.json ? stderr : stdout;  // the human-readable table
  std::fprintf(out,
               "store_bench: %d groups x K=%d, P=%d, R=%d tokens (%.2f MB serialized, %.1f "
               "KB/group); median of %d\n",
               a.groups, a.k, a.prompt, a.response, mb, 1e3 * mb / n, a.reps);
  std::fprintf(out, "%-14s %12s %10s %10s\n", "path", "groups/s", "MB/s", "vs raw");
  auto row = [&](const char* name, double s, bool ratio) {
    char vs[16] = "-";
    if (ratio) std::snprintf(vs, sizeof vs, "%.2f", median(raw) / s);
    std::fprintf(out, "%-14s %12.1f %10.1f %10s\n", name, n / s, mb / s, vs);
    if (a.json) {
      relay::bench::JsonRow j("store");
      j.add("path", name).add("groups_per_s", n / s).add("mb_per_s", mb / s);
      if (ratio) j.add("vs_raw", median(raw) / s);
      j.add("groups", a.groups).add("reps", a.reps).print();
    }
  };
  row("raw file", median(raw), true);
  row("store", median(synced), true);
  row("store-nosync", median(nosync), true);
  row("take (x64)", median(take), false);
  return 0;
}
