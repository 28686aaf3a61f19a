#include "relay/trainer/data_parallel.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace relay::trainer {

std::vector<std::vector<int64_t>> shard_rows_by_tokens(const std::vector<int64_t>& rows,
                                                       const std::vector<int64_t>& row_tokens,
                                                       int world) {
  std::vector<std::vector<int64_t>> shards(static_cast<size_t>(std::max(1, world)));
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return row_tokens[a] > row_tokens[b]; });
  std::vector<int64_t> load(shards.size(), 0);
  for (size_t i : order) {
    const size_t to =
        static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    shards[to].push_back(rows[i]);
    load[to] += row_tokens[i];
  }
  for (auto& shard : shards) std::sort(shard.begin(), shard.end());
  return shards;
}

Status all_reduce_gradients(Collectives& group, const std::vector<at::Tensor>& params,
                            int64_t bucket_bytes) {
  torch::NoGradGuard no_grad;
  // Which gradients exist anywhere: a rank without rows for a parameter
  // contributes zeros, a parameter no rank touched keeps no gradient.
  at::Tensor defined = torch::zeros({static_cast<int64_t>(params.size())}, torch::kFloat32);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) defined[static_cast<int64_t>(i)] = 1.0f;
  }
  RELAY_RETURN_IF_ERROR(group.all_reduce_sum(defined));
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    if (defined[static_cast<int64_t>(i)].item<float>() == 0) continue;
    at::Tensor p = params[i];
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  // Flat fp32 buckets on the gradients' device, in parameter order; a
  // bucket is summed in one collective and copied back.
  const int64_t bucket_elems = std::max<int64_t>(1, bucket_bytes / 4);
  size_t begin = 0;
  while (begin < grads.size()) {
    size_t end = begin;
    int64_t elems = 0;
    while (end < grads.size() && (end == begin || elems + grads[end].numel() <= bucket_elems)) {
      elems += grads[end].numel();
      ++end;
    }
    std::vector<at::Tensor> flat;
    for (size_t i = begin; i < end; ++i) flat.push_back(grads[i].reshape({-1}).to(torch::kFloat32));
    at::Tensor bucket = torch::cat(flat);
    RELAY_RETURN_IF_ERROR(group.all_reduce_sum(bucket));
    int64_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      const int64_t n = grads[i].numel();
      grads[i].copy_(bucket.narrow(0, offset, n).view(grads[i].sizes()));
      offset += n;
    }
    begin = end;
  }
  return OkStatus();
}

Status broadcast_bytes(Collectives& group, std::string& bytes, int root) {
  at::Tensor size = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64);
  RELAY_RETURN_IF_ERROR(group.broadcast(size, root));
  const int64_t n = size.item<int64_t>();
  if (n == 0) {
    bytes.clear();
    return OkStatus();
  }
  at::Tensor buffer = torch::empty({n}, torch::kUInt8);
  if (group.rank() == root) std::memcpy(buffer.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  RELAY_RETURN_IF_ERROR(group.broadcast(buffer, root));
  if (group.rank() != root) {
    bytes.assign(reinterpret_cast<const char*>(buffer.data_ptr<uint8_t>()), static_cast<size_t>(n));
  }
  return OkStatus();
}

Status all_reduce_named_sums(Collectives& group, std::map<std::string, double>& sums) {
  // The union of the ranks' key sets: each rank's keys, broadcast in turn.
  // Metric names contain no newline.
  std::set<std::string> keys;
  for (const auto& [k, v] : sums) keys.insert(k);
  for (int r = 0; r < group.world_size(); ++r) {
    std::string mine;
    if (r == group.rank()) {
      std::vector<std::string> names;
      for (const auto& [k, v] : sums) names.push_back(k);
      mine = absl::StrJoin(names, "\n");
    }
    RELAY_RETURN_IF_ERROR(broadcast_bytes(group, mine, r));
    if (!mine.empty()) {
      for (absl::string_view k : absl::StrSplit(mine, '\n')) keys.insert(std::string(k));
    }
  }
  if (keys.empty()) return OkStatus();
  at::Tensor values = torch::zeros({static_cast<int64_t>(keys.size())}, torch::kFloat64);
  int64_t i = 0;
  for (const std::string& k : keys) {
    if (auto it = sums.find(k); it != sums.end()) values[i] = it->second;
    ++i;
  }
  RELAY_RETURN_IF_ERROR(group.all_reduce_sum(values));
  i = 0;
  for (const std::string& k : keys) sums[k] = values[i++].item<double>();
  return OkStatus();
}

}  // namespace relay::trainer
