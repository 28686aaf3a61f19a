#pragma once

// A decode step (one new position for each of B sequences) in fixed shapes,
// captured once per shape as a CUDA graph and replayed, as vLLM and SGLang
// do for decode. At a small batch on a GPU the step's time is the host
// launching each layer's kernels one by one (hundreds a step, a few
// microseconds each), not the GPU running them; a replay launches them all
// at once.
//
// Shapes are fixed by padding: B up to a batch bucket, the attention's key
// range up to a context bucket. Every per-step input (token ids, positions,
// the cache row each new key is written to, the rows each sequence's keys
// are read from) is copied into buffers the captured kernels read. Padding
// rows write to the cache's scratch row and attend only to its zero row;
// padding keys are masked. The logits are what PolicyImpl::extend would
// return for the same step, up to the order of floating-point sums over the
// longer (masked) key range.
//
// On the CPU, or with DecodeGraphOptions::capture off, the same fixed-shape
// step runs eagerly, with no graph: that is what the unit tests check
// against extend(). Without a graph it saves nothing, so the engine uses it
// on the CPU only when told to (rollout.decode_graphs: on).
//
// A graph holds the addresses of the weights, the KV cache's storage and
// its buffers: weights must change in place (Engine::apply_update copies
// into them). step() checks the embedding's and the cache's addresses and
// the autocast state, and drops its graphs when one of them changed.
//
// Thread-safety: none; the engine thread owns it.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace relay::model {

class KVCache;
class PolicyImpl;

struct DecodeGraphOptions {
  // Batch sizes a step is padded up to, ascending; a larger batch runs
  // through extend().
  std::vector<int64_t> batch_buckets = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
  // Key positions are padded to the next power of two from min_context up,
  // and past context_step to the next multiple of context_step; never
  // past the cache's max_seq_len.
  int64_t min_context = 64;
  int64_t context_step = 1024;
  // Shapes (graphs) held at once; past it the least recently used one is
  // dropped. Each holds a cudaGraphExec of every kernel of a step; their
  // activations share one memory pool. A 32K context could otherwise use
  // 13 x 36 shapes.
  int64_t max_buckets = 64;
  // Capture and replay CUDA graphs on a CUDA device (in a build with CUDA).
  // Off, or on any other device, the fixed-shape step runs eagerly.
  bool capture = true;
};

struct DecodeGraphStats {
  int64_t steps = 0;     // steps run in fixed shapes
  int64_t captures = 0;  // graphs captured
  int64_t replays = 0;   // steps run by replaying a graph
  int64_t resets = 0;    // times every graph was dropped (addresses or autocast changed)
  int64_t evicted = 0;   // shapes dropped for max_buckets
  int64_t declined = 0;  // steps left to extend() (batch or key range out of the buckets)
};

class DecodeGraphs {
 public:
  explicit DecodeGraphs(DecodeGraphOptions options = {});
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Whether `policy` over a cache of `block_size` positions a block can run
  // in fixed shapes at all: dense layers only (MoE routing reads counts
  // back to the host), whole weights (no layer hooks), a cache with a
  // scratch row (block_size >= 2). When not, *why says which.
  static bool supports(const PolicyImpl& policy, int64_t block_size, std::string* why);
  // Whether a step on this device would replay CUDA graphs (capture on, a
  // CUDA build, a CUDA device).
  bool captures_on(c10::Device device) const;

  // One decode step: appends ids[b] to the sequence in cache slot slots[b],
  // as policy.extend(ids as [B, 1], ones, slots, cache, {kLast,
  // vocab_limit}) would, advances the cache and returns logits [B, V]: a
  // view of a buffer the next step overwrites. An undefined tensor, with
  // the cache untouched, when the batch is larger than the last bucket or
  // the key range cannot be padded (a RoPE that depends on the length
  // past max_position_embeddings): the caller runs extend(). Throws
  // c10::Error as extend() does (REQUIRES: supports()).
  at::Tensor step(PolicyImpl& policy, KVCache& cache, const std::vector<int64_t>& ids,
                  const std::vector<int64_t>& slots, int64_t vocab_limit);

  // Drops every graph and buffer.
  void reset();
  // Why a capture failed, empty if none has. The step that failed runs its
  // fixed shapes eagerly; every later step() declines (extend() decodes).
  const std::string& capture_error() const { return capture_error_; }
  const DecodeGraphStats& stats() const { return stats_; }
  // Graphs (or, without capture, buffer sets) held now.
  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }

  // The batch bucket of B (0 = none), the key range of a step whose
  // longest sequence reaches kv_len positions (0 = none within max_len).
  int64_t batch_bucket(int64_t B) const;
  int64_t context_bucket(int64_t kv_len, int64_t max_len) const;

 private:
  struct Bucket;
  struct GraphPool;

  // The addresses and autocast state the graphs were captured with.
  struct Key {
    const void* weights = nullptr;
    const void* cache = nullptr;
    int64_t vocab_limit = 0;
    int autocast = -1;
    bool operator!=(const Key& o) const {
      return weights != o.weights || cache != o.cache || vocab_limit != o.vocab_limit ||
             autocast != o.autocast;
    }
  };

  Bucket& bucket(int64_t B, int64_t S, c10::Device device);
  void run(Bucket& b, PolicyImpl& policy, KVCache& cache, int64_t vocab_limit);
  // Captures `forward` into b.graph (and b.logits); throws c10::Error.
  void capture(Bucket& b, const std::function<at::Tensor()>& forward);

  DecodeGraphOptions options_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Bucket>> buckets_;
  int64_t uses_ = 0;                 // step counter: each bucket's last use, for eviction
  std::unique_ptr<GraphPool> pool_;  // one CUDA graph memory pool for every bucket
  Key key_;
  DecodeGraphStats stats_;
  std::string capture_error_;
};

}  // namespace relay::model
