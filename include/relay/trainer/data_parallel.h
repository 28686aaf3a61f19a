#pragma once

// Data-parallel training across trainer ranks (one process each).
//
// Every rank runs Trainer::step() on the same trajectory groups, so the
// batch, the filters, the advantages and the normalizers come out the same
// everywhere without being sent. What each rank does alone is the expensive
// part: it scores and back-propagates only its shard of every (mini-)batch,
// rows chosen so that the ranks get about the same number of tokens. The
// shards' results are summed across ranks:
//   * the pre-update pass's [B, L] log-probs (each row is nonzero on exactly
//     one rank, so the sum is exact);
//   * the gradients, in flat fp32 buckets. The loss of every shard is
//     normalised by the whole mini-batch's token and sequence counts, so the
//     sum over ranks is the single-rank gradient of the same batch, up to
//     the order of fp32 additions;
//   * the step's metric sums.
// An all-reduce leaves the same bytes on every rank, so the clipped gradient,
// the AdamW update and the weights stay bit-identical across ranks without
// ever being broadcast.
//
// Collectives hides the transport (c10d Gloo or NCCL: comm/trainer_group.h)
// so that this module and its tests need no c10d headers.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/rollout/trajectory.h"

namespace relay::trainer {

// The collectives one rank of the trainer group can run. Every rank calls
// the same operations in the same order with tensors of the same shapes and
// dtypes; an operation fails (Unavailable or DeadlineExceeded, naming it)
// when a rank does not arrive within the group's timeout.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Element-wise sum across ranks, in place. Tensors may live on the CPU or
  // on the group's device; each is reduced as one flat buffer.
  virtual Status all_reduce_sum(at::Tensor& tensor) = 0;
  // Rank `root`'s tensor into every other rank's (same shape), in place.
  virtual Status broadcast(at::Tensor& tensor, int root) = 0;
  // Every rank's `shard` (the same shape everywhere) into `out`, flat and in
  // rank order: out.numel() == world_size() * shard.numel(), same dtype.
  virtual Status all_gather(const at::Tensor& shard, at::Tensor& out) = 0;
  // The sum across ranks of `full`'s rank()-th slice into `shard`: `full`
  // flat is world_size() equal slices, shard.numel() elements each. NCCL
  // runs its reduce-scatter; Gloo (LibTorch has none for it) an all-reduce
  // of a copy of `full` and keeps the slice: the same sums, twice the bytes.
  virtual Status reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard) = 0;
  // An atomic counter in the group's rendezvous store: adds `delta` and
  // returns the new value (delta 0 reads it). Rank 0 announces work with it;
  // the others poll it, which (unlike a collective) can wait without a
  // deadline for as long as rank 0 lives.
  virtual StatusOr<int64_t> add_counter(const std::string& key, int64_t delta) = 0;
};

// What the trainer does with the other ranks.
struct DataParallel {
  std::shared_ptr<Collectives> group;  // null or world size 1: a single rank
  int64_t bucket_bytes = int64_t{25} << 20;
  // Rank 0 only: called first thing by Trainer::step() ("step") and
  // Trainer::sft_step() ("sft_step") with that call's groups, so that the
  // other ranks can be told to make the same call (comm/trainer_ranks.h).
  // An error fails the call before anything changed.
  std::function<Status(const std::string& call, const std::vector<rollout::TrajectoryGroup>&)> lead;

  int rank() const { return group ? group->rank() : 0; }
  int world_size() const { return group ? group->world_size() : 1; }
  bool active() const { return world_size() > 1; }
};

// Splits rows into `world` shards of about equal token counts: longest
// first, each to the shard with the fewest tokens so far (ties to the lower
// shard, then the lower row), each shard in ascending row order. A shard may
// be empty when there are fewer rows than shards. Deterministic: every rank
// computes the same split.
std::vector<std::vector<int64_t>> shard_rows_by_tokens(const std::vector<int64_t>& rows,
                                                       const std::vector<int64_t>& row_tokens,
                                                       int world);

// Sums the gradients of `params` across the group in flat fp32 buckets of
// at most `bucket_bytes` (a larger tensor is its own bucket), in place. A
// parameter whose gradient is undefined on some ranks (none of its rows
// there touched it) gets zeros there first; one undefined on every rank
// stays undefined, as it would on a single rank.
Status all_reduce_gradients(Collectives& group, const std::vector<at::Tensor>& params,
                            int64_t bucket_bytes);

// Sums named values across the group. Ranks may hold different key sets (a
// rank that saw no rows has no loss-specific metrics); the result has the
// union, each key summed over the ranks that hold it.
Status all_reduce_named_sums(Collectives& group, std::map<std::string, double>& sums);

// Rank `root`'s bytes into every rank's string.
Status broadcast_bytes(Collectives& group, std::string& bytes, int root);

}  // namespace relay::trainer
