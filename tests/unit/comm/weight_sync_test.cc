// The c10d weight broadcast on loopback: a server and clients in threads of
// this process, and one test with a member in a child process that is killed.
// Timeouts are 1-3 s so that the failure cases stay quick.

#include "relay/comm/weight_sync/weight_sync.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <thread>

extern char** environ;

namespace relay::comm {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

WeightSnapshot snapshot_of(int64_t version, const std::unordered_map<std::string, at::Tensor>& w) {
  WeightPublisher p;
  EXPECT_TRUE(p.publish(version, w).ok());
  return *p.snapshot(version).value();
}

// Float32, bfloat16 and int64 tensors whose sizes no bucket size divides.
WeightSnapshot mixed(int64_t version) {
  torch::manual_seed(version);
  return snapshot_of(version, {{"model.a", torch::randn({37, 13})},
                               {"model.b", torch::randn({501}).to(torch::kBFloat16)},
                               {"model.c", torch::randint(-9, 9, {77}, torch::kInt64)},
                               {"model.norm", torch::full({}, 1.0f + version)}});
}

// `floats` float32 values in two tensors.
WeightSnapshot large(int64_t version, int64_t floats) {
  torch::manual_seed(version);
  return snapshot_of(version,
                     {{"big", torch::randn({floats - 1000})}, {"small", torch::randn({1000})}});
}

// What the gRPC path (FetchWeights) reassembles from the same snapshot.
std::unordered_map<std::string, at::Tensor> fetched(const WeightSnapshot& snap) {
  std::string bytes;
  for_each_chunk(snap, 1000, [&](uint64_t, const char* data, uint64_t size) {
    bytes.append(data, size);
    return true;
  });
  return tensors_from_bytes(snap.manifest, bytes).value();
}

void expect_same(const WeightSnapshot& snap, const ReceivedVersion& got) {
  EXPECT_EQ(got.version, snap.manifest.version);
  EXPECT_EQ(got.manifest.digest, snap.manifest.digest);
  EXPECT_EQ(got.bytes, snap.total_bytes);
  const auto via_grpc = fetched(snap);
  ASSERT_EQ(got.tensors.size(), snap.tensors.size());
  for (size_t i = 0; i < snap.tensors.size(); ++i) {
    const std::string& name = snap.manifest.tensors[i].name;
    const at::Tensor& t = got.tensors.at(name);
    EXPECT_EQ(t.scalar_type(), snap.tensors[i].scalar_type()) << name;
    EXPECT_TRUE(torch::equal(t, snap.tensors[i])) << name;
    EXPECT_TRUE(torch::equal(t, via_grpc.at(name))) << name;
  }
}

WeightSyncServerOptions server_options(int64_t bucket_bytes, milliseconds timeout) {
  WeightSyncServerOptions o;
  o.bucket_bytes = bucket_bytes;
  o.timeout = timeout;
  return o;
}

std::unique_ptr<WeightSyncClient> connect(const WeightSyncServer& server, const std::string& name,
                                          milliseconds timeout) {
  WeightSyncClientOptions o;
  o.endpoint = server.endpoint();
  o.member_name = name;
  o.timeout = timeout;
  auto c = WeightSyncClient::connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

// A worker's receive loop on its own thread, recording what arrives. On
// Unavailable it rejoins (as a worker would after fetching over gRPC); after
// `hang_after` versions it stops calling receive but keeps its client alive.
class Receiver {
 public:
  explicit Receiver(std::unique_ptr<WeightSyncClient> client, int hang_after = -1)
      : client_(std::move(client)), hang_after_(hang_after), thread_([this] { run(); }) {}
  ~Receiver() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Waits up to 10 s for pred() (called under the lock).
  bool wait_for(const std::function<bool()>& pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), pred);
  }
  bool wait_versions(size_t n) {
    return wait_for([&] { return versions_.size() >= n; });
  }
  bool wait_rejoins(int n) {
    return wait_for([&] { return rejoins_ >= n; });
  }
  std::vector<ReceivedVersion> versions() {
    std::lock_guard<std::mutex> lock(mu_);
    return versions_;
  }
  std::vector<Status> errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }

 private:
  void run() {
    auto stopped = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      return stop_;
    };
    while (!stopped()) {
      StatusOr<ReceivedVersion> r = client_->receive(stopped);
      std::unique_lock<std::mutex> lock(mu_);
      if (r.ok()) {
        versions_.push_back(std::move(r).value());
      } else if (r.status().code() != absl::StatusCode::kCancelled) {
        errors_.push_back(r.status());
      }
      cv_.notify_all();
      if (static_cast<int>(versions_.size()) == hang_after_) {
        cv_.wait(lock, [&] { return stop_; });
      }
      if (!r.ok() && r.status().code() == absl::StatusCode::kUnavailable) {
        lock.unlock();
        Status s = client_->rejoin();
        lock.lock();
        EXPECT_TRUE(s.ok()) << s;
        ++rejoins_;
        cv_.notify_all();
      }
    }
  }

  std::unique_ptr<WeightSyncClient> client_;
  const int hang_after_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<ReceivedVersion> versions_;
  std::vector<Status> errors_;
  int rejoins_ = 0;
  std::thread thread_;
};

TEST(WeightSyncTest, TwoMembersReceiveThreeVersionsBitIdentical) {
  auto server = WeightSyncServer::start(server_options(4096, milliseconds(3000))).value();
  Receiver a(connect(*server, "worker-a", milliseconds(3000)));
  Receiver b(connect(*server, "worker-b", milliseconds(3000)));
  for (int64_t v = 1; v <= 3; ++v) {
    const WeightSnapshot snap = large(v, 10000);  // 40 KB: 10 buckets
    auto report = server->broadcast(snap);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->members, 2);
    EXPECT_EQ(report->generation, 1);
    EXPECT_EQ(report->regrouped, v == 1);
    EXPECT_EQ(report->bytes, snap.total_bytes);
    for (Receiver* r : {&a, &b}) {
      ASSERT_TRUE(r->wait_versions(v));
      expect_same(snap, r->versions()[v - 1]);
    }
  }
  EXPECT_TRUE(a.errors().empty());
  EXPECT_TRUE(b.errors().empty());
}

TEST(WeightSyncTest, BucketsSmallerThanATensorWithMixedDtypes) {
  auto server = WeightSyncServer::start(server_options(1000, milliseconds(3000))).value();
  Receiver a(connect(*server, "worker-a", milliseconds(3000)));
  const WeightSnapshot snap = mixed(5);
  ASSERT_EQ(snap.total_bytes, 1924u + 1002u + 616u + 4u);  // 4 buckets, the last 546 bytes
  auto report = server->broadcast(snap);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_TRUE(a.wait_versions(1));
  expect_same(snap, a.versions()[0]);
  EXPECT_EQ(a.versions()[0].manifest.tensors[1].dtype, "BF16");
}

TEST(WeightSyncTest, AWorkerJoiningMidRunGetsTheNextVersionAfterARegroup) {
  auto server = WeightSyncServer::start(server_options(1000, milliseconds(3000))).value();
  Receiver a(connect(*server, "worker-a", milliseconds(3000)));
  Receiver b(connect(*server, "worker-b", milliseconds(3000)));
  for (int64_t v = 1; v <= 2; ++v) {
    auto report = server->broadcast(mixed(v));
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->generation, 1);
  }
  Receiver c(connect(*server, "worker-c", milliseconds(3000)));
  const WeightSnapshot v3 = mixed(3);
  auto report = server->broadcast(v3);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->regrouped);
  EXPECT_EQ(report->generation, 2);
  EXPECT_EQ(report->members, 3);
  ASSERT_TRUE(a.wait_versions(3));
  ASSERT_TRUE(b.wait_versions(3));
  ASSERT_TRUE(c.wait_versions(1));
  for (Receiver* r : {&a, &b}) {
    EXPECT_EQ(r->versions()[1].version, 2);
    EXPECT_EQ(r->versions()[1].generation, 1);
    expect_same(v3, r->versions()[2]);
  }
  expect_same(v3, c.versions()[0]);
  EXPECT_EQ(c.versions()[0].generation, 2);
  EXPECT_TRUE(a.errors().empty() && b.errors().empty() && c.errors().empty());
}

// A member that stops receiving (alive, sockets open) blocks the sends (Gloo
// sends only into a posted receive): the broadcast fails after about the
// timeout, and the survivors rejoin and get the next version without it.
TEST(WeightSyncTest, AHungMemberFailsTheBroadcastWithinTheTimeout) {
  const milliseconds timeout(1000);
  auto server = WeightSyncServer::start(server_options(1 << 20, timeout)).value();
  Receiver a(connect(*server, "worker-a", timeout));
  Receiver b(connect(*server, "worker-b", timeout));
  Receiver hung(connect(*server, "worker-hung", timeout), /*hang_after=*/1);
  ASSERT_TRUE(server->broadcast(large(1, 1 << 20)).ok());
  ASSERT_TRUE(a.wait_versions(1) && b.wait_versions(1) && hung.wait_versions(1));

  const WeightSnapshot v2 = large(2, 1 << 20);
  const auto start = Clock::now();
  auto failed = server->broadcast(v2);
  const double elapsed = since(start);
  std::printf("  the broadcast failed after %.3f s: %s\n", elapsed,
              std::string(failed.status().message()).c_str());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_LT(elapsed, 1.0 + 1.5) << failed.status();
  EXPECT_EQ(server->generation(), 0) << "the broken generation is dropped";

  ASSERT_TRUE(a.wait_rejoins(1));
  ASSERT_TRUE(b.wait_rejoins(1));
  const WeightSnapshot v3 = large(3, 1 << 16);
  auto report = server->broadcast(v3);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->members, 2);
  EXPECT_TRUE(report->regrouped);
  for (Receiver* r : {&a, &b}) {
    ASSERT_TRUE(r->wait_versions(2));
    expect_same(v3, r->versions().back());
    ASSERT_FALSE(r->errors().empty());
    EXPECT_EQ(r->errors()[0].code(), absl::StatusCode::kUnavailable) << r->errors()[0];
  }
}

// The child side of AKilledMemberProcess...: a member in its own process that
// reports over a pipe. Skipped unless the parent test started it.
TEST(WeightSyncChildProcess, MemberUntilKilled) {
  const char* spec = std::getenv("RELAY_WEIGHT_SYNC_CHILD");
  if (spec == nullptr) GTEST_SKIP() << "run by AKilledMemberProcessFailsTheBroadcastQuickly";
  std::istringstream in(spec);
  std::string endpoint;
  int fd = -1;
  in >> endpoint >> fd;
  WeightSyncClientOptions o;
  o.endpoint = endpoint;
  o.member_name = "child";
  o.timeout = milliseconds(2000);
  auto client = WeightSyncClient::connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_EQ(::write(fd, "j", 1), 1);
  while (true) {
    auto r = (*client)->receive(nullptr);
    if (!r.ok()) break;
    ASSERT_EQ(::write(fd, "v", 1), 1);
  }
  ::pause();  // until killed
}

// Reads one byte from fd within 10 s; '\0' when none came.
char read_byte(int fd) {
  pollfd p{fd, POLLIN, 0};
  char c = '\0';
  if (::poll(&p, 1, 10000) == 1 && ::read(fd, &c, 1) == 1) return c;
  return '\0';
}

// A member process killed with SIGKILL: its sockets close, so the broadcast
// fails well inside the timeout; the survivor rejoins and gets the next one.
TEST(WeightSyncTest, AKilledMemberProcessFailsTheBroadcastQuickly) {
  const milliseconds timeout(2000);
  auto server = WeightSyncServer::start(server_options(1 << 20, timeout)).value();

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string filter = "--gtest_filter=WeightSyncChildProcess.MemberUntilKilled";
  const std::string env =
      "RELAY_WEIGHT_SYNC_CHILD=" + server->endpoint() + " " + std::to_string(fds[1]);
  std::vector<char*> envp{const_cast<char*>(env.c_str())};
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(nullptr);
  char* argv[] = {const_cast<char*>(self.c_str()), const_cast<char*>(filter.c_str()), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, self.c_str(), &actions, nullptr, argv, envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  struct Reap {
    pid_t pid;
    int fd;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      ::close(fd);
    }
  } reap{child, fds[0]};
  ASSERT_EQ(read_byte(fds[0]), 'j') << "the child did not connect";

  Receiver a(connect(*server, "worker-a", timeout));
  auto first = server->broadcast(large(1, 1 << 20));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->members, 2);
  ASSERT_EQ(read_byte(fds[0]), 'v') << "the child did not receive version 1";
  ASSERT_TRUE(a.wait_versions(1));

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  const WeightSnapshot v2 = large(2, 1 << 20);
  const auto start = Clock::now();
  auto failed = server->broadcast(v2);
  const double elapsed = since(start);
  std::printf("  the broadcast failed after %.3f s: %s\n", elapsed,
              std::string(failed.status().message()).c_str());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_LT(elapsed, 2.0 + 1.5) << failed.status();

  ASSERT_TRUE(a.wait_rejoins(1));
  const WeightSnapshot v3 = large(3, 1 << 10);
  auto report = server->broadcast(v3);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->members, 1);
  ASSERT_TRUE(a.wait_versions(2));
  expect_same(v3, a.versions().back());
}

// A worker that asks to join but never comes to the rendezvous breaks that
// generation within the timeout, for the trainer and the member moved into it;
// the member rejoins and the next generation goes ahead without the no-show.
TEST(WeightSyncTest, AJoinerThatNeverArrivesFailsTheRendezvousWithinTheTimeout) {
  const milliseconds timeout(1000);
  auto server = WeightSyncServer::start(server_options(1000, timeout)).value();
  Receiver a(connect(*server, "worker-a", timeout));
  ASSERT_TRUE(server->broadcast(mixed(1)).ok());
  ASSERT_TRUE(a.wait_versions(1));

  auto absent = connect(*server, "worker-absent", timeout);  // never calls receive()
  const WeightSnapshot v2 = mixed(2);
  const auto start = Clock::now();
  auto failed = server->broadcast(v2);
  const double elapsed = since(start);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_NE(std::string(failed.status().message()).find("rendezvous"), std::string::npos)
      << failed.status();
  EXPECT_LT(elapsed, 1.0 + 1.5) << failed.status();

  ASSERT_TRUE(a.wait_rejoins(1));
  const WeightSnapshot v3 = mixed(3);
  auto report = server->broadcast(v3);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->members, 1);
  ASSERT_TRUE(a.wait_versions(2));
  expect_same(v3, a.versions().back());
}

// A client destroyed cleanly asks to leave: the next broadcast regroups
// without it and the others never see an error.
TEST(WeightSyncTest, ALeavingMemberIsDroppedWithoutBreakingTheGroup) {
  auto server = WeightSyncServer::start(server_options(1000, milliseconds(3000))).value();
  Receiver a(connect(*server, "worker-a", milliseconds(3000)));
  auto b = std::make_unique<Receiver>(connect(*server, "worker-b", milliseconds(3000)));
  ASSERT_TRUE(server->broadcast(mixed(1)).ok());
  ASSERT_TRUE(a.wait_versions(1) && b->wait_versions(1));
  b.reset();
  const WeightSnapshot v2 = mixed(2);
  auto report = server->broadcast(v2);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->regrouped);
  EXPECT_EQ(report->members, 1);
  ASSERT_TRUE(a.wait_versions(2));
  expect_same(v2, a.versions()[1]);
  EXPECT_TRUE(a.errors().empty());
}

TEST(WeightSyncTest, ZeroMembersReturnsAtOnce) {
  auto server = WeightSyncServer::start(server_options(1000, milliseconds(3000))).value();
  const auto start = Clock::now();
  auto report = server->broadcast(mixed(1));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->members, 0);
  EXPECT_EQ(report->generation, 0);
  EXPECT_EQ(report->bytes, 0u);
  EXPECT_LT(since(start), 1.0) << "nothing to wait for";
}

TEST(WeightSyncTest, ServerShutdownEndsReceiveAndStopCancels) {
  auto server = WeightSyncServer::start(server_options(1000, milliseconds(3000))).value();
  auto client = connect(*server, "worker-a", milliseconds(3000));
  std::atomic<int> calls{0};
  auto r = client->receive([&] { return ++calls > 3; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();

  std::thread t([&] { ASSERT_TRUE(server->broadcast(mixed(1)).ok()); });
  ASSERT_TRUE(client->receive(nullptr).ok());
  t.join();
  EXPECT_EQ(client->generation(), 1);
  server.reset();
  r = client->receive(nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(client->generation(), 0);
}

TEST(WeightSyncTest, OptionsAndConnectErrorsAreReported) {
  WeightSyncServerOptions bad;
  bad.bucket_bytes = 0;
  EXPECT_EQ(WeightSyncServer::start(bad).status().code(), absl::StatusCode::kInvalidArgument);
  WeightSyncClientOptions o;
  o.member_name = "w";
  o.endpoint = "no-port";
  EXPECT_EQ(WeightSyncClient::connect(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.endpoint = "127.0.0.1:1";  // nothing listens there
  o.timeout = milliseconds(300);
  EXPECT_EQ(WeightSyncClient::connect(o).status().code(), absl::StatusCode::kUnavailable);
#ifndef RELAY_WITH_CUDA
  o.device = "cuda";
  EXPECT_EQ(WeightSyncClient::connect(o).status().code(), absl::StatusCode::kInvalidArgument);
#endif
}

}  // namespace
}  // namespace relay::comm
