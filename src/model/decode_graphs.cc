#include "relay/model/decode_graphs.h"

#include <ATen/autocast_mode.h>
#include <torch/types.h>
#include <torch/version.h>

#include <algorithm>
#include <functional>
#include <optional>

#include <spdlog/spdlog.h>

#ifdef RELAY_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "model/extend_plan.h"
#include "relay/model/device.h"
#include "relay/model/kv_cache.h"
#include "relay/model/policy.h"
#include "relay/model/rope.h"

namespace relay::model {

// The buffers of one (batch, key range) shape and, on a CUDA device, its
// graph. `host` is filled each step and copied to `inputs` in one copy;
// ids, positions, write_index and read_index are views of `inputs`.
struct DecodeGraphs::Bucket {
  int64_t B = 0, S = 0;
  int64_t last_use = 0;
  at::Tensor host, inputs;
  at::Tensor ids, positions, write_index, read_index;
  at::Tensor key_positions;  // arange(max(S, B))
  at::Tensor logits;         // the captured step's output ([B, V]); eager: the last step's
#ifdef RELAY_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

struct DecodeGraphs::GraphPool {
#ifdef RELAY_WITH_CUDA
  // MempoolId_t, whose namespace moved between LibTorch versions.
  decltype(at::cuda::graph_pool_handle()) id;
#endif
};

DecodeGraphs::DecodeGraphs(DecodeGraphOptions options) : options_(std::move(options)) {
  TORCH_CHECK(!options_.batch_buckets.empty() &&
                  std::is_sorted(options_.batch_buckets.begin(), options_.batch_buckets.end()) &&
                  options_.batch_buckets.front() >= 1,
              "DecodeGraphOptions: batch_buckets must be ascending and >= 1");
  TORCH_CHECK(options_.min_context >= 1 && options_.context_step >= 1,
              "DecodeGraphOptions: min_context and context_step must be >= 1");
  TORCH_CHECK(options_.max_buckets >= 1, "DecodeGraphOptions: max_buckets must be >= 1");
}

DecodeGraphs::~DecodeGraphs() = default;

bool DecodeGraphs::supports(const PolicyImpl& policy, int64_t block_size, std::string* why) {
  std::string reason;
  if (policy.config().num_experts > 0) {
    reason = "MoE layers read their routing counts back to the host";
  } else if (policy.model->layer_hooks() != nullptr) {
    reason = "the weights are sharded (layer hooks)";
  } else if (block_size < 2) {
    reason = "the KV cache's blocks hold 1 position (no scratch row)";
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

bool DecodeGraphs::captures_on(c10::Device device) const {
#ifdef RELAY_WITH_CUDA
  return options_.capture && device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

int64_t DecodeGraphs::batch_bucket(int64_t B) const {
  for (int64_t b : options_.batch_buckets) {
    if (b >= B) return b;
  }
  return 0;
}

int64_t DecodeGraphs::context_bucket(int64_t kv_len, int64_t max_len) const {
  if (kv_len < 1 || kv_len > max_len) return 0;
  int64_t s = options_.min_context;
  while (s < kv_len && s < options_.context_step) s *= 2;
  if (s < kv_len)
    s = (kv_len + options_.context_step - 1) / options_.context_step * options_.context_step;
  return std::min(s, max_len);
}

void DecodeGraphs::reset() {
  buckets_.clear();
  pool_.reset();
}

DecodeGraphs::Bucket& DecodeGraphs::bucket(int64_t B, int64_t S, c10::Device device) {
  if (auto it = buckets_.find({B, S}); it != buckets_.end()) {
    it->second->last_use = ++uses_;
    return *it->second;
  }
  if (static_cast<int64_t>(buckets_.size()) >= options_.max_buckets) {
    auto oldest = std::min_element(
        buckets_.begin(), buckets_.end(),
        [](const auto& a, const auto& b) { return a.second->last_use < b.second->last_use; });
    buckets_.erase(oldest);
    ++stats_.evicted;
  }
  std::unique_ptr<Bucket>& slot = buckets_[{B, S}];
  auto b = std::make_unique<Bucket>();
  b->last_use = ++uses_;
  b->B = B;
  b->S = S;
  const int64_t n = B * (3 + S);
  b->host = torch::empty({n}, torch::kInt64);
  b->inputs = torch::empty({n}, torch::dtype(torch::kInt64).device(device));
  b->ids = b->inputs.narrow(0, 0, B);
  b->positions = b->inputs.narrow(0, B, B);
  b->write_index = b->inputs.narrow(0, 2 * B, B);
  b->read_index = b->inputs.narrow(0, 3 * B, B * S).view({B, S});
  b->key_positions = torch::arange(std::max(S, B), torch::dtype(torch::kInt64).device(device));
  slot = std::move(b);
  return *slot;
}

#ifdef RELAY_WITH_CUDA
namespace {

// Autocast keeps the casts of weights it made for reuse within its scope; a
// graph captured with them would read casts freed when the scope ends.
// Capture casts inside the graph instead (torch.cuda.graph's advice too).
class NoAutocastCache {
 public:
  NoAutocastCache() : was_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(was_); }

 private:
  bool was_;
};

}  // namespace
#endif

void DecodeGraphs::run(Bucket& b, PolicyImpl& policy, KVCache& cache, int64_t vocab_limit) {
  auto forward = [&] {
    return policy.decode_fixed(b.ids, b.positions, b.write_index, b.read_index, b.key_positions,
                               cache, vocab_limit);
  };
#ifdef RELAY_WITH_CUDA
  if (captures_on(b.inputs.device())) {
    if (b.graph) {
      b.graph->replay();
      ++stats_.replays;
      return;
    }
    try {
      capture(b, forward);
      b.graph->replay();
      ++stats_.replays;
      return;
    } catch (const c10::Error& e) {
      // This step runs eagerly below; later steps are left to extend().
      capture_error_ = e.what_without_backtrace();
      b.graph.reset();
      spdlog::warn(
          "rollout.decode_graphs: capturing the decode step (batch {}, {} keys) failed; decoding "
          "without graphs from now on: {}",
          b.B, b.S, capture_error_);
    }
  }
#endif
  b.logits = forward();
}

#ifdef RELAY_WITH_CUDA
void DecodeGraphs::capture(Bucket& b, const std::function<at::Tensor()>& forward) {
  const NoAutocastCache no_cache;
  const c10::Device device = b.inputs.device();
  const c10::cuda::CUDAGuard device_guard(device);
  // Capture runs on a side stream, after the inputs copied on the current
  // one; a first eager run there makes cuBLAS's handle and workspace for
  // that stream outside the capture. Writing the step's keys twice is
  // harmless: both runs write the same values to the same rows.
  c10::cuda::device_synchronize();
  c10::cuda::CUDAStream side =
      c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  {
    const c10::cuda::CUDAStreamGuard stream_guard(side);
    forward();
    side.synchronize();
    if (!pool_) {
      pool_ = std::make_unique<GraphPool>();
      pool_->id = at::cuda::graph_pool_handle();
    }
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    // Thread-local: another thread of the process (a weight fetch
    // staging a version, NCCL) may call the CUDA API meanwhile; the
    // default global mode would fail its calls, or this capture.
#if TORCH_VERSION_MAJOR >= 2
    graph->capture_begin(pool_->id, cudaStreamCaptureModeThreadLocal);
#else
    graph->capture_begin(pool_->id);  // 1.x takes no mode: global
#endif
    try {
      b.logits = forward();
    } catch (...) {
      // End the stream's capture, or every later call on it fails too.
      try {
        graph->capture_end();
      } catch (...) {
      }
      throw;
    }
    graph->capture_end();
    b.graph = std::move(graph);
  }
  c10::cuda::device_synchronize();
  ++stats_.captures;
}
#endif

at::Tensor DecodeGraphs::step(PolicyImpl& policy, KVCache& cache, const std::vector<int64_t>& ids,
                              const std::vector<int64_t>& slots, int64_t vocab_limit) {
  const auto B = static_cast<int64_t>(ids.size());
  TORCH_CHECK(B >= 1 && slots.size() == ids.size(),
              "DecodeGraphs::step: one slot per token, at least one row");
  if (!capture_error_.empty()) {  // graphs failed here once: extend() from now on
    ++stats_.declined;
    return at::Tensor();
  }
  const PolicyConfig& config = policy.config();
  int64_t longest = 0;  // the step's key range: every row's cache after its new position
  for (int64_t slot : slots) {
    TORCH_CHECK(slot >= 0 && slot < cache.num_slots(), "Policy::extend: slot ", slot,
                " out of range");
    longest = std::max(longest, cache.length(slot) + 1);
  }
  int64_t max_len = cache.max_seq_len();
  // extend() rotates with the default frequencies up to
  // max_position_embeddings; a padded key range must not cross it.
  if (rope_depends_on_length(config)) max_len = std::min(max_len, config.max_position_embeddings);
  const int64_t Bb = batch_bucket(B), S = context_bucket(longest, max_len);
  if (Bb == 0 || S == 0) {
    ++stats_.declined;
    return at::Tensor();
  }

  const at::Tensor& weights = policy.model->embed_tokens->weight;
  const c10::Device device = weights.device();
  const std::optional<c10::ScalarType> autocast = current_autocast(device.type());
  Key key;
  key.weights = weights.data_ptr();
  key.cache = cache.keys(0).data_ptr();
  key.vocab_limit = vocab_limit;
  key.autocast = autocast ? static_cast<int>(*autocast) : -1;
  if (key != key_) {
    if (!buckets_.empty()) ++stats_.resets;
    reset();
    key_ = key;
  }

  const std::vector<int64_t> ones(B, 1);
  int64_t kv_len = 0;
  const std::vector<int64_t> past = prepare_extend(cache, ones.data(), slots.data(), B, 1, &kv_len);
  Bucket& b = bucket(Bb, S, device);
  int64_t* h = b.host.data_ptr<int64_t>();
  int64_t* read = h + 3 * Bb;
  std::vector<int64_t> rows, write_rows;
  extend_rows(cache, past, ones.data(), slots.data(), /*T=*/1, S, read, rows, write_rows);
  for (int64_t r = 0; r < Bb; ++r) {
    const bool real = r < B;
    h[r] = real ? ids[r] : 0;
    h[Bb + r] = real ? past[r] : 0;
    h[2 * Bb + r] = real ? write_rows[r] : KVCache::kScratchRow;
    if (!real) std::fill(read + r * S, read + (r + 1) * S, KVCache::kZeroRow);
  }
  // One synchronous copy: the host buffer is free again when it returns.
  b.inputs.copy_(b.host);

  run(b, policy, cache, vocab_limit);
  // Only now is the step complete: a throw above leaves every length as it was.
  for (int64_t r = 0; r < B; ++r) cache.advance(slots[r], 1);
  ++stats_.steps;
  return b.logits.narrow(0, 0, B);
}

}  // namespace relay::model
