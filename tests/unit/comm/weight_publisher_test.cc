#include "relay/comm/weight_sync/weight_publisher.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>

namespace relay::comm {
namespace {

std::unordered_map<std::string, at::Tensor> weights(float base) {
  return {{"a", torch::full({3}, base)}, {"b", torch::arange(5, torch::kFloat32) + base}};
}

TEST(WeightPublisherTest, VersionsIncreaseAndOnlyTheLatestAreKept) {
  WeightPublisher p(/*keep=*/2);
  EXPECT_EQ(p.latest_version(), -1);
  EXPECT_EQ(p.snapshot(-1).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(p.publish(0, weights(0)).ok());
  ASSERT_TRUE(p.publish(1, weights(1)).ok());
  EXPECT_EQ(p.publish(1, weights(2)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p.publish(3, weights(3)).ok());
  EXPECT_EQ(p.latest_version(), 3);
  EXPECT_EQ(p.snapshot(0).status().code(), absl::StatusCode::kNotFound) << "keep = 2";
  auto s1 = p.snapshot(1).value();
  EXPECT_EQ(s1->manifest.version, 1);
  EXPECT_EQ(s1->total_bytes, 32u);  // (3 + 5) fp32
  EXPECT_EQ(s1->manifest.tensors[0].name, "a");
  EXPECT_TRUE(torch::equal(s1->tensors[1], torch::arange(5, torch::kFloat32) + 1));
}

TEST(WeightPublisherTest, SnapshotIsACopyTakenAtPublish) {
  WeightPublisher p;
  auto w = weights(0);
  ASSERT_TRUE(p.publish(0, w).ok());
  w["a"].add_(7);  // the trainer keeps training
  EXPECT_TRUE(torch::equal(p.snapshot(0).value()->tensors[0], torch::zeros({3})));
}

// The evicted version's payload is published into again when no reader
// holds it; a reader's snapshot is never written under it.
TEST(WeightPublisherTest, AnEvictedVersionsPayloadIsReusedOnlyWhenNobodyHoldsIt) {
  WeightPublisher p(/*keep=*/1);
  ASSERT_TRUE(p.publish(1, weights(1)).ok());
  const void* first = p.snapshot(1).value()->payload.data_ptr();
  ASSERT_TRUE(p.publish(2, weights(2)).ok());
  auto v2 = p.snapshot(2).value();
  EXPECT_EQ(v2->payload.data_ptr(), first) << "nobody held version 1";
  EXPECT_TRUE(torch::equal(v2->tensors[1], torch::arange(5, torch::kFloat32) + 2));
  EXPECT_EQ(v2->manifest.digest, model::weight_manifest(weights(2), 2).value().digest);

  ASSERT_TRUE(p.publish(3, weights(3)).ok());  // v2 is still held: a new payload
  auto v3 = p.snapshot(3).value();
  EXPECT_NE(v3->payload.data_ptr(), v2->payload.data_ptr());
  EXPECT_TRUE(torch::equal(v2->tensors[1], torch::arange(5, torch::kFloat32) + 2));
  EXPECT_EQ(p.snapshot(2).status().code(), absl::StatusCode::kNotFound);

  at::Tensor view = v3->tensors[0];  // a view outlives its snapshot
  v3.reset();
  ASSERT_TRUE(p.publish(4, weights(4)).ok());
  EXPECT_TRUE(torch::equal(view, torch::full({3}, 3.0f)));
}

// With one version kept, publishing writes the next version into the
// current one's payload when nobody holds it. A reader in that window (a
// worker leasing or fetching) still finds a version: it waits for the new
// one, and the latest version never goes back to -1 ("nothing published").
TEST(WeightPublisherTest, ReadersFindAVersionWhileTheOnlyOneIsRebuilt) {
  WeightPublisher p(/*keep=*/1);
  auto big = [](float base) {
    return std::unordered_map<std::string, at::Tensor>{{"w", torch::full({1 << 20}, base)}};
  };
  ASSERT_TRUE(p.publish(1, big(1)).ok());
  std::atomic<bool> done{false};
  std::atomic<int64_t> reads{0}, missing{0}, unpublished{0};
  std::thread reader([&] {
    while (!done.load()) {
      if (p.latest_version() < 1) ++unpublished;
      // Dropped at once, so that the publisher may reuse the payload.
      if (!p.snapshot(-1).ok()) ++missing;
      ++reads;
    }
  });
  for (int64_t v = 2; v <= 40; ++v) ASSERT_TRUE(p.publish(v, big(static_cast<float>(v))).ok());
  done = true;
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(missing.load(), 0) << "of " << reads.load() << " reads";
  EXPECT_EQ(unpublished.load(), 0) << "of " << reads.load() << " reads";
  auto last = p.snapshot(-1).value();
  EXPECT_EQ(last->manifest.version, 40);
  EXPECT_TRUE(torch::equal(last->tensors[0], torch::full({1 << 20}, 40.0f)));
}

// Chunks cut across tensor boundaries, in order, and reassemble exactly.
TEST(WeightPublisherTest, ChunksReassembleAndTheDigestIsChecked) {
  WeightPublisher p;
  ASSERT_TRUE(p.publish(4, weights(2)).ok());
  auto snap = p.snapshot(4).value();
  for (uint64_t chunk : {1u, 5u, 12u, 32u, 1000u}) {
    std::string bytes;
    std::vector<uint64_t> offsets;
    for_each_chunk(*snap, chunk, [&](uint64_t offset, const char* data, uint64_t size) {
      offsets.push_back(offset);
      EXPECT_LE(size, chunk);
      bytes.append(data, size);
      return true;
    });
    EXPECT_EQ(offsets.size(), (32 + chunk - 1) / chunk) << chunk;
    auto back = tensors_from_bytes(snap->manifest, bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(torch::equal(back->at("b"), torch::arange(5, torch::kFloat32) + 2));
  }
  std::string bytes;
  for_each_chunk(*snap, 8, [&](uint64_t, const char* data, uint64_t size) {
    bytes.append(data, size);
    return true;
  });
  std::string flipped = bytes;
  flipped[13] ^= 1;
  auto bad = tensors_from_bytes(snap->manifest, flipped);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(bad.status().message()).find("weights version 4: digest"),
            std::string::npos);
  EXPECT_EQ(tensors_from_bytes(snap->manifest, bytes.substr(1)).status().code(),
            absl::StatusCode::kDataLoss);
  // An emit that returns false stops the walk.
  int calls = 0;
  for_each_chunk(*snap, 4, [&](uint64_t, const char*, uint64_t) { return ++calls < 3; });
  EXPECT_EQ(calls, 3);
}

// Chunks land in place as they arrive; out-of-order, overlapping or excess
// bytes and an early finish are DataLoss.
TEST(WeightPublisherTest, AssemblerBuildsTensorsChunkByChunk) {
  WeightPublisher p;
  ASSERT_TRUE(p.publish(1, weights(3)).ok());
  auto snap = p.snapshot(1).value();
  for (uint64_t chunk : {1u, 7u, 12u, 100u}) {
    auto a = WeightAssembler::create(snap->manifest);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->total_bytes(), 32u);
    for_each_chunk(*snap, chunk, [&](uint64_t offset, const char* data, uint64_t size) {
      EXPECT_TRUE(a->add(offset, data, size).ok());
      return true;
    });
    EXPECT_EQ(a->received_bytes(), 32u);
    auto back = a->finish();
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(torch::equal(back->at("a"), snap->tensors[0]));
    EXPECT_TRUE(torch::equal(back->at("b"), torch::arange(5, torch::kFloat32) + 3));
  }
  std::string bytes;
  for_each_chunk(*snap, 32, [&](uint64_t, const char* data, uint64_t size) {
    bytes.append(data, size);
    return true;
  });
  auto a = WeightAssembler::create(snap->manifest).value();
  EXPECT_EQ(a.add(4, bytes.data() + 4, 4).code(), absl::StatusCode::kDataLoss);  // a gap
  ASSERT_TRUE(a.add(0, bytes.data(), 8).ok());
  EXPECT_EQ(a.add(4, bytes.data() + 4, 4).code(), absl::StatusCode::kDataLoss);  // an overlap
  EXPECT_EQ(a.add(8, bytes.data(), 30).code(), absl::StatusCode::kDataLoss);     // past the end
  EXPECT_EQ(a.finish().status().code(), absl::StatusCode::kDataLoss);            // 8 of 32
}

// A `stop` for wait_for_version() that tells `looked` when the waiter first
// asked it. The waiter holds the publisher's lock from that look until it
// sleeps, so whatever the test does after `looked` happens while it sleeps.
struct FirstLook {
  std::promise<void> looked;
  bool told = false;  // only the waiter's thread touches it
  std::atomic<bool> stop{false};
  std::function<bool()> fn() {
    return [this] {
      if (!told) {
        told = true;
        looked.set_value();
      }
      return stop.load();
    };
  }
};

TEST(WeightPublisherTest, WaitWakesOnPublishOrStopOrTimesOut) {
  using Clock = std::chrono::steady_clock;
  WeightPublisher p;
  ASSERT_TRUE(p.publish(0, weights(0)).ok());
  const auto t0 = Clock::now();
  EXPECT_EQ(p.wait_for_version(0, std::chrono::milliseconds(20)), 0);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(20));

  // Only a lost wake-up waits out this timeout.
  const auto generous = std::chrono::seconds(60);
  {
    FirstLook probe;
    auto waited =
        std::async(std::launch::async, [&] { return p.wait_for_version(0, generous, probe.fn()); });
    probe.looked.get_future().wait();
    ASSERT_TRUE(p.publish(1, weights(1)).ok());
    EXPECT_EQ(waited.get(), 1);
  }
  {
    FirstLook probe;
    const auto t1 = Clock::now();
    auto waited =
        std::async(std::launch::async, [&] { return p.wait_for_version(1, generous, probe.fn()); });
    probe.looked.get_future().wait();
    probe.stop = true;
    p.wake_waiters();
    EXPECT_EQ(waited.get(), 1) << "stopped: the latest version, nothing newer";
    EXPECT_LT(Clock::now() - t1, generous);
  }
}

}  // namespace
}  // namespace relay::comm
