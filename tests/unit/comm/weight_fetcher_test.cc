// WeightFetcher against an in-memory trainer (testing/fake_trainer_client.h):
// versions wanted during a download (fetched after it, once the one taken is
// released), superseded versions, and the digest retry.

#include "relay/comm/worker/weight_fetcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "testing/fake_trainer_client.h"

namespace relay::comm {
namespace {

using testing::FakeTrainer;
using testing::FakeTrainerClient;

FetchedWeights weights_at(int64_t v) {
  FetchedWeights w;
  w.manifest.version = v;
  w.manifest.digest = 1000 + static_cast<uint64_t>(v);
  return w;
}

// The outcome the fetcher hands over next, waiting up to 10 s for it.
StatusOr<FetchedWeights> next(WeightFetcher& f) {
  if (!f.wait(std::chrono::seconds(10))) return DeadlineExceededError("no outcome in 10 s");
  return *f.take();
}

TEST(WeightFetcherTest, AVersionWantedDuringADownloadIsFetchedAfterIt) {
  FakeTrainer trainer;
  for (int64_t v : {1, 2, 3}) trainer.versions[v] = weights_at(v);
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> started{0};
  trainer.on_fetch = [&](int64_t) {
    ++started;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return open; });
  };
  FakeTrainerClient client(&trainer);
  WeightFetcher f(&client, "w1", 0);
  EXPECT_FALSE(f.pending());
  f.want(1);
  EXPECT_TRUE(f.pending());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (started.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(started.load(), 1) << "the download of version 1 began";
  f.want(3);
  f.want(2);  // older than one asked for: changes nothing
  EXPECT_EQ(f.wanted(), 3);
  {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
  }
  cv.notify_all();
  StatusOr<FetchedWeights> w = next(f);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->manifest.version, 1);
  EXPECT_TRUE(f.pending()) << "3 is still to come";
  // Not while version 1 is held (its taker has not released it): a
  // download now would be another copy of the weights beside it.
  EXPECT_FALSE(f.wait(std::chrono::milliseconds(200)));
  EXPECT_EQ(started.load(), 1) << "the download of version 3 began before the release";
  f.release();
  w = next(f);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->manifest.version, 3);
  EXPECT_EQ(w->manifest.digest, 1003u);
  EXPECT_FALSE(f.pending());
  EXPECT_FALSE(f.take().has_value());
  std::lock_guard<std::mutex> lock(trainer.mu);
  EXPECT_EQ(trainer.fetched, (std::vector<int64_t>{1, 3}));
}

// NotFound: the version was superseded while it was asked for. Nothing is
// handed over; the next version wanted is fetched.
TEST(WeightFetcherTest, ASupersededVersionHandsNothingOver) {
  FakeTrainer trainer;
  trainer.versions[6] = weights_at(6);
  FakeTrainerClient client(&trainer);
  WeightFetcher f(&client, "w1", 0);
  f.want(5);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (f.pending() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(f.pending()) << "the download ended";
  EXPECT_FALSE(f.take().has_value());
  f.want(6);
  StatusOr<FetchedWeights> w = next(f);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->manifest.version, 6);
}

// DataLoss (a chunk failed its digest) is fetched once more; a second
// failure, like any other error, is handed over.
TEST(WeightFetcherTest, ADigestFailureIsFetchedOnceMoreThenHandedOver) {
  FakeTrainer trainer;
  trainer.versions[1] = weights_at(1);
  trainer.versions[2] = weights_at(2);
  trainer.fetch_errors = {DataLossError("bad chunk"), DataLossError("bad chunk"),
                          DataLossError("bad chunk again")};
  FakeTrainerClient client(&trainer);
  WeightFetcher f(&client, "w1", 0);
  f.want(1);
  StatusOr<FetchedWeights> w = next(f);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss);
  f.want(2);
  w = next(f);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->manifest.version, 2);
  std::lock_guard<std::mutex> lock(trainer.mu);
  EXPECT_EQ(trainer.fetched, (std::vector<int64_t>{1, 1, 2, 2}));
}

TEST(WeightFetcherTest, ADeadTrainerIsHandedOverAsTheError) {
  FakeTrainer trainer;
  trainer.down = UnavailableError("FetchWeights: connection refused");
  FakeTrainerClient client(&trainer);
  WeightFetcher f(&client, "w1", 0);
  f.want(1);
  StatusOr<FetchedWeights> w = next(f);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(w.status().message()).find("connection refused"), std::string::npos);
}

}  // namespace
}  // namespace relay::comm
